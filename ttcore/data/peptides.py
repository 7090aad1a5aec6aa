"""A synthetic peptide-like family with a known grammar (docs/own-data.md's example, the pretrained-model table):
a start of G/F/M/A, any residue, a core of 4-18 residues whose every third one is one of GSEKD and the others
LIVFAKR, an end of KK / R / KR / DE. The generator and the grammar's check live side by side so they agree."""

import random

AMINO = "ACDEFGHIKLMNPQRSTVWY"
STARTS, ENDS = "GFMA", ("KK", "R", "KR", "DE")


def _core_symbols(k: int) -> str:
    return "LIVFAKR" if k % 3 else "GSEKD"


def peptides(n: int, seed: int = 0) -> list[str]:
    """``n`` seeded strings of the grammar (lengths 8-24)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        core = "".join(rng.choice(_core_symbols(k)) for k in range(rng.randint(4, 18)))
        out.append(rng.choice(STARTS) + rng.choice(AMINO) + core + rng.choice(ENDS))
    return out


def grammatical(s: str) -> bool:
    """Whether the grammar produces ``s`` (some end and a core of 4-18 residues)."""
    if len(s) < 7 or s[0] not in STARTS or s[1] not in AMINO:
        return False
    for end in ENDS:
        core = s[2:len(s) - len(end)]
        if s.endswith(end) and 4 <= len(core) <= 18 and all(c in _core_symbols(k) for k, c in enumerate(core)):
            return True
    return False
