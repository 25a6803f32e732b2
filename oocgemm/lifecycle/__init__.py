"""A run's life around its plan: the operands and output opened and checked before any work
(:class:`~oocgemm.lifecycle.run.RunIO`), the output's layout and target checks, the journal
of the blocks written, and how an interrupted run is found and resumed. It stands above
:mod:`oocgemm.storage` (the adapters, which know nothing of plans) and
:mod:`oocgemm.planning` (which never touches storage)."""
