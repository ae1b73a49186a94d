"""Hugging Face checkpoints in and out (``mmp checkpoint import-hf | export-hf``).

* ``hf`` -- a Hugging Face model directory, read and written one tensor at a time;
* ``families`` -- per architecture family: the Megatron flags that build the same model, which
  config fields it understands, and how each tensor maps to Megatron's (one layer at a time);
* ``worker`` -- the Megatron side, run on the ranks of the target layout through the layer: it
  builds the model as stock ``pretrain_gpt.py`` does and fills it, loads it, or saves it with
  Megatron's own checkpointing (so every format and layout is upstream's);
* ``plan`` -- the parallel layout of a conversion and the plan file its worker steps read;
* ``conversion`` -- the two conversions: the checks made before anything is written, the flags
  of each step, and the steps themselves, which write into a temporary directory renamed at the
  end;
* ``cli`` -- the two verbs: their options, and the exit status of each outcome.

The conversion itself needs no accelerator and no TransformerEngine.
"""
