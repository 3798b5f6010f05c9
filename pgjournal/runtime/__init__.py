"""How statements run: steps and their drivers, retries, the live loop, signals, metrics."""
