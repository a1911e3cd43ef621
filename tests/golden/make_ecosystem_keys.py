"""Write the state-dict key and shape lists of torchvision's ResNets and timm's ViTs to tests/golden/ecosystem/.

The tests check our conversions against these lists, made once by the real libraries (they do not import on the
CPU-only torch wheel the suite runs with). Made on 2026-11-27 with torch 2.13.0 (CPU), torchvision 0.28.0 and timm
1.0.29, their wheels unpacked into one folder: torchvision's package __init__ cannot load its compiled ops on the CPU
wheel, so ``torchvision`` and ``torchvision.models`` are empty packages here and only the pure-Python model files
run (resnet.py never calls the ops; timm's ViT never calls torchvision)::

    pip download --no-deps -d whl torchvision==0.28.0 timm==1.0.29
    mkdir site && (cd site && for w in ../whl/*.whl; do python -m zipfile -e $w .; done)
    PYTHONPATH=site python tests/golden/make_ecosystem_keys.py site
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import torch


def main(site: str) -> None:
    for name in ("torchvision", "torchvision.models"):
        module = types.ModuleType(name)
        module.__path__ = [str(Path(site) / name.replace(".", "/"))]
        sys.modules[name] = module
    import timm
    import torchvision.models.resnet as tv_resnet

    out = Path(__file__).with_name("ecosystem")
    out.mkdir(exist_ok=True)
    models = {f"torchvision_{n}": getattr(tv_resnet, n)() for n in ("resnet18", "resnet50")}
    models.update({f"timm_{n}": timm.create_model(n, pretrained=False)
                   for n in ("vit_tiny_patch16_224", "vit_small_patch16_224", "vit_base_patch16_224")})
    for name, model in models.items():
        rows = ",\n".join(f"  {json.dumps(k)}: {list(v.shape)}" for k, v in model.state_dict().items())
        made_by = f"torch {torch.__version__}, torchvision 0.28.0, timm {timm.__version__}"
        (out / f"{name}.json").write_text(f'{{"made_by": "{made_by}",\n"shapes": {{\n{rows}\n}}}}\n')
        shapes = json.loads((out / f"{name}.json").read_text())["shapes"]
        print(name, len(shapes))


if __name__ == "__main__":
    main(sys.argv[1])
