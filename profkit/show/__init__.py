"""Showing: terminal and markdown tables, the HTML report, plots, Perfetto export."""
