"""Objectives of the unified gradient paradigm: each takes the two views' embeddings (z, z')
and returns a LossOutput(loss, stats). `build(name, **overrides)` makes one from conf/loss/.
Each objective registers itself (`@part("loss", <name>)`); every module here is imported, so a new one is found.
"""

from sentemb.common.parts import import_parts
from sentemb.losses.arccon import ArcCon
from sentemb.losses.base import LossOutput, Objective, normalize
from sentemb.losses.focal import FocalInfoNCE
from sentemb.losses.infonce import InfoNCE
from sentemb.losses.modified import ModifiedBarlowTwins, ModifiedMHE, ModifiedMHS, ModifiedVICReg
from sentemb.losses.noncontrastive import AlignMHE, AlignMHS, BarlowTwins, VICReg
from sentemb.losses.paradigm import Paradigm
from sentemb.losses.registry import available, build
from sentemb.losses.triplet import MAT, MET, MPT
from sentemb.losses.weighted_sum import WeightedSum

import_parts(__name__, __path__)  # a loss module not listed above registers too

__all__ = [
    "MAT",
    "MET",
    "MPT",
    "VICReg",
    "AlignMHE",
    "AlignMHS",
    "ArcCon",
    "BarlowTwins",
    "FocalInfoNCE",
    "InfoNCE",
    "LossOutput",
    "ModifiedBarlowTwins",
    "ModifiedMHE",
    "ModifiedMHS",
    "ModifiedVICReg",
    "Objective",
    "Paradigm",
    "WeightedSum",
    "available",
    "build",
    "normalize",
]
