"""Decision: statistics, tolerance bands, verdicts, the gate, calibration's simulation.

Pure Python plus scipy: nothing here imports torch.
"""
