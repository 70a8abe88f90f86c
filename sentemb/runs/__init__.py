"""Training jobs and what they leave behind: a job's lifecycle (rerun policy, run files, record, exit status),
W&B naming and offline logs, sweep reports and their winner."""
