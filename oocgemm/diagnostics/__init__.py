"""Timeline events recorded by the executors (exporters come separately)."""

from .events import Event, EventLog

__all__ = ["Event", "EventLog"]
