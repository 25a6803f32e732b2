"""Timeline events recorded by the executors, the overlap report built from them, and its
exporters: Chrome trace JSON (:mod:`.trace`) and a Gantt plot (:mod:`.plot`, needs matplotlib)."""

from .events import Event, EventLog
from .timeline import LaneStats, LinkStats, Timeline

__all__ = ["Event", "EventLog", "LaneStats", "LinkStats", "Timeline"]
