"""All the layer knows about upstream releases, in one package.

* ``tables`` -- the supported Megatron and torch releases (what the install requirement, the
  checks, the tests and the README derive from);
* ``ranges`` -- the one way a version range is written, the one comparator, and which table row
  a version belongs to;
* ``installed`` -- the versions installed here (megatron-core, the Megatron-LM checkout, torch,
  torch_musa), read without importing them;
* ``check`` -- the activation checks: a release outside a table, parts that do not belong
  together (a checkout of another release, a torch_musa built on another torch);
* ``facts`` -- upstream behaviour that changed between releases, as named ranges;
* ``targets`` -- where each object the layer patches lives, per release range;
* ``checkpoint_files`` -- Megatron's own checkpoint file names (the tracker, ``metadata.json``).

Supporting a new release is one table row; verifying it is the compatibility matrix's run on it
and moving ``tables.MEGATRON_VERIFIED`` (docs/contributing.md).

Importing the package imports none of them (``setup.py`` loads ``tables`` by path).
"""
