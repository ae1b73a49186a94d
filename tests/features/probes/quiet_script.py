"""A training script that prints one line."""

print("done", flush=True)
