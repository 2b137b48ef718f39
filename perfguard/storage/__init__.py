"""Storage: the files perfguard reads and writes (cases, results, baselines, reports).

Pure Python: nothing here imports torch, so the file commands run where it is absent.
"""
