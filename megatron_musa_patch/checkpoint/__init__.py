"""Hugging Face checkpoints in and out (``mmp checkpoint import-hf | export-hf``).

* ``hf`` -- a Hugging Face model directory, read and written one tensor at a time;
* ``families`` -- per architecture family: the Megatron flags that build the same model, which
  config fields it understands, and how each tensor maps to Megatron's (one layer at a time);
* ``worker`` -- the Megatron side, run on the ranks of the target layout through the layer: it
  builds the model as stock ``pretrain_gpt.py`` does and fills it, loads it, or saves it with
  Megatron's own checkpointing (so every format and layout is upstream's);
* ``cli`` -- the two verbs, which write into a temporary directory and rename it at the end.

The conversion itself needs no accelerator and no TransformerEngine.
"""
