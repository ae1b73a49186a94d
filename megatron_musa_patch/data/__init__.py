"""The ``mmp data`` commands: tokenize, multi-process binarize, and blend training data.

One job per module:

* ``types``           the records passed between modules and processes (a leaf)
* ``indexfile``       Megatron's ``.idx`` format, written and read without importing megatron-core
* ``inputs``          expand ``--input`` (files, globs, directories) and cut files into chunks
* ``tokenizer``       megatron-core's tokenizer builder, flags, fingerprint, batched encoders
* ``light``           tokenizer.json alone, checked once against megatron-core's builder (cached)
* ``encode``          worker side: read a chunk, parse, tokenize, pack tokens as arrays
* ``writer``          atomic ``.bin/.idx`` pairs (the bytes IndexedDatasetBuilder writes)
* ``manifest``        what a finished pair was built from, so a rerun skips it
* ``progress``        tqdm on a terminal, plain periodic lines otherwise
* ``prepare``         ``mmp data prepare`` (drop-in for Megatron-LM's tools/preprocess_data.py)
* ``blend``           ``mmp data blend`` (check pairs, print the weighted DATA_PATH)
* ``train_tokenizer`` ``mmp data train-tokenizer`` (byte-level BPE with ``tokenizers``)
* ``reference``       run Megatron-LM's own preprocess_data.py (tests and benchmark)

Nothing here needs the device layer to be active, and nothing imports ``megatron.training``.
Imports flow one way, down the layers ``tests/data/test_layering.py`` lists.
"""
