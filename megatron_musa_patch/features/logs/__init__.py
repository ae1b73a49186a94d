"""What a run prints: the start-up log in brief, progress while a rank starts, tokens/s and MFU."""
