"""What a conversion runs at: the parallel ``Layout``, and the ``Plan`` its worker steps read."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

from .errors import ConversionError


@dataclass(frozen=True)
class Layout:
    """Tensor-, pipeline- and expert-parallel sizes; the default, ``Layout()``, is one rank."""

    tp: int = 1
    pp: int = 1
    ep: int = 1

    @classmethod
    def from_options(cls, opts) -> Layout:
        """The layout asked for on the command line (Megatron's flag names), refused where a
        size is below 1."""
        layout = cls(opts.tensor_model_parallel_size, opts.pipeline_model_parallel_size,
                     opts.expert_model_parallel_size)
        bad = {k: v for k, v in dataclasses.asdict(layout).items() if v < 1}
        if bad:
            raise ConversionError(f"parallel sizes must be 1 or more, not {bad}.")
        return layout

    @classmethod
    def from_args(cls, args) -> Layout:
        """The layout a checkpoint was saved at, from the args stored in it (which lack the
        expert size, or hold None, where the model has no experts)."""
        return cls(args.tensor_model_parallel_size, args.pipeline_model_parallel_size,
                   getattr(args, "expert_model_parallel_size", 1) or 1)

    @property
    def ranks(self) -> int:
        return self.tp * self.pp * self.ep

    def flags(self) -> List[str]:
        return ["--tensor-model-parallel-size", str(self.tp),
                "--pipeline-model-parallel-size", str(self.pp),
                "--expert-model-parallel-size", str(self.ep)]

    def __str__(self) -> str:
        return f"TP{self.tp} PP{self.pp} EP{self.ep}"


@dataclass(frozen=True)
class Plan:
    """What a conversion's worker steps read beyond Megatron's flags, handed over as a JSON file
    (``worker --plan FILE``): for the import, the Hugging Face directory to fill from; for the
    export, the config, the directory to write, the temporary directory to write it in (made,
    and removed should the export end early, by ``mmp checkpoint``), the files to copy beside
    it, the dtype and the largest shard. ``save_format``: the format a step saves in, where that is not the one it
    loads (None: Megatron's ``--ckpt-format``)."""

    hf_dir: Optional[str] = None
    hf_config: Optional[dict] = None
    hf_out: Optional[str] = None
    hf_tmp: Optional[str] = None
    side_files: Tuple[str, ...] = ()
    dtype: Optional[str] = None
    max_shard_bytes: Optional[int] = None
    save_format: Optional[str] = None

    def write(self, path: Path) -> None:
        Path(path).write_text(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def read(cls, path) -> Plan:
        fields = json.loads(Path(path).read_text())
        return cls(**{**fields, "side_files": tuple(fields["side_files"])})
