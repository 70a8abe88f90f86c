"""What runs leave behind: run records, W&B naming and offline logs, sweep reports and their winner."""
