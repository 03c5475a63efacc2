"""Fakes of external systems that tests talk to over their real protocols."""
