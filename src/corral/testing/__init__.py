"""Tools for testing code that runs on corral, and corral itself."""

from corral.testing.history import History, HistoryLog, Run, Violation

__all__ = ["History", "HistoryLog", "Run", "Violation"]
