"""Presentation: tables, Markdown, plots and the history archive of reports.

Pure Python (rich, pandas, matplotlib): nothing here imports torch.
"""
