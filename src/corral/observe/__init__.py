"""A live view of a trial: call statistics, worker states, the stats file, the
dashboard (``corral dashboard``) and the terminal table (``corral top``).

The controller side (``calls``, ``snapshot``, ``publisher``) imports only the standard
library; the dashboard server and ``rich`` are imported by the commands that need them.
"""

from corral.observe.call_stats import CallStats, NullCallStats

__all__ = ["CallStats", "NullCallStats"]
