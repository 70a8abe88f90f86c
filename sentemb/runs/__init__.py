"""Training jobs and what they leave behind: a job's lifecycle (rerun policy, run files, record, exit status),
W&B naming and offline logs, a sweep checked before its first job, sweep reports and their winner."""
