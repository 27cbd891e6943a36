"""What operators and orchestrators read: health, the HTTP probe, metrics."""
