"""A rank that spends ``argv[1]`` seconds in a function named like Megatron's dataset builder
without printing, then says it is done."""

import sys
import time


def build_train_valid_test_data_iterators(seconds):
    time.sleep(seconds)


build_train_valid_test_data_iterators(float(sys.argv[1]))
print("done", flush=True)
