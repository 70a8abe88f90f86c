"""What every part shares and that depends on no other part: the error type, where data lives, Hydra plumbing,
the process-wide settings each command makes (process.py)."""
