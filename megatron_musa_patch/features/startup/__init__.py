"""Start-up without CUDA tools and without work a rank does not need before its first step."""
