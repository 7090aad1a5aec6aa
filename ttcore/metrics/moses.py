"""The MOSES benchmark's table (Polykovskiy et al. 2020, "Molecular Sets (MOSES): A Benchmarking Platform for
Molecular Generation Models", Front. Pharmacol. 11:565644): one row per sampler setting, in MOSES's columns,
each by MOSES's definition (``ttcore.metrics.distribution``; checked against molsets' own code in
``tests/metrics/test_moses_definitions.py``): Valid, Unique@1k, Unique@10k, FCD / SNN / Frag / Scaf against
the test set and the scaffold-test set, IntDiv_1, IntDiv_2 and Novelty (against the training split), and
beside them GenMol's Quality (valid, unique, QED >= 0.6, SA <= 4: ``ttcore.metrics.molecules.quality``), which
MOSES does not publish. MOSES's Filters column (MCF / PAINS filters) is not computed.

``PUBLISHED`` holds the baseline rows as MOSES publishes them (mean and standard deviation over three runs
of 30,000 samples): the README of github.com/molecularsets/moses at commit dd7ed6a (2023), the same figures
as the paper's Table 2.
"""

from .distribution import Reference, internal_diversity, moses_counts
from .molecules import quality

COLUMNS = ["valid", "unique@1k", "unique@10k", "fcd/test", "fcd/testsf", "snn/test", "snn/testsf", "frag/test",
           "frag/testsf", "scaf/test", "scaf/testsf", "int_div", "int_div2", "novelty", "quality"]
HEADERS = ["Valid", "Unique@1k", "Unique@10k", "FCD/Test", "FCD/TestSF", "SNN/Test", "SNN/TestSF", "Frag/Test",
           "Frag/TestSF", "Scaf/Test", "Scaf/TestSF", "IntDiv", "IntDiv2", "Novelty", "Quality"]
# Quality is GenMol's (ttcore.metrics.molecules.quality), not one of MOSES's columns: the published rows lack it
PUBLISHED_SOURCE = ("MOSES (Polykovskiy et al. 2020), github.com/molecularsets/moses README at commit dd7ed6a: "
                    "mean (std) over 3 runs of 30,000 samples")
# name -> values in COLUMNS order (mean, std); the Train row is MOSES's own figures for training molecules
PUBLISHED = {
    "Train": [(1.0, 0), (1.0, 0), (1.0, 0), (0.008, 0), (0.4755, 0), (0.6419, 0), (0.5859, 0), (1.0, 0),
              (0.9986, 0), (0.9907, 0), (0.0, 0), (0.8567, 0), (0.8508, 0), (1.0, 0)],
    "CharRNN": [(0.9748, 0.0264), (1.0, 0.0), (0.9994, 0.0003), (0.0732, 0.0247), (0.5204, 0.0379),
                (0.6015, 0.0206), (0.5649, 0.0142), (0.9998, 0.0002), (0.9983, 0.0003), (0.9242, 0.0058),
                (0.1101, 0.0081), (0.8562, 0.0005), (0.8503, 0.0005), (0.8419, 0.0509)],
    "AAE": [(0.9368, 0.0341), (1.0, 0.0), (0.9973, 0.002), (0.5555, 0.2033), (1.0572, 0.2375), (0.6081, 0.0043),
            (0.5677, 0.0045), (0.991, 0.0051), (0.9905, 0.0039), (0.9022, 0.0375), (0.0789, 0.009),
            (0.8557, 0.0031), (0.8499, 0.003), (0.7931, 0.0285)],
    "VAE": [(0.9767, 0.0012), (1.0, 0.0), (0.9984, 0.0005), (0.099, 0.0125), (0.567, 0.0338), (0.6257, 0.0005),
            (0.5783, 0.0008), (0.9994, 0.0001), (0.9984, 0.0003), (0.9386, 0.0021), (0.0588, 0.0095),
            (0.8558, 0.0004), (0.8498, 0.0004), (0.6949, 0.0069)],
    "JTN-VAE": [(1.0, 0.0), (1.0, 0.0), (0.9996, 0.0003), (0.3954, 0.0234), (0.9382, 0.0531), (0.5477, 0.0076),
                (0.5194, 0.007), (0.9965, 0.0003), (0.9947, 0.0002), (0.8964, 0.0039), (0.1009, 0.0105),
                (0.8551, 0.0034), (0.8493, 0.0035), (0.9143, 0.0058)],
    "LatentGAN": [(0.8966, 0.0029), (1.0, 0.0), (0.9968, 0.0002), (0.2968, 0.0087), (0.8281, 0.0117),
                  (0.5371, 0.0004), (0.5132, 0.0002), (0.9986, 0.0004), (0.9972, 0.0007), (0.8867, 0.0009),
                  (0.1072, 0.0098), (0.8565, 0.0007), (0.8505, 0.0006), (0.9498, 0.0006)],
}


def moses_row(generated: list[str], train: set[str], test: Reference, test_sf: Reference) -> dict:
    """MOSES's columns for one set of samples (``generated``: every sample, invalid ones included), GenMol's
    quality, ``samples`` and ``n_valid``. Unique@k is absent when fewer than k samples are valid; the distribution
    columns are None with fewer than two. The samples are described once for both references."""
    row = {"samples": len(generated), **moses_counts(generated, train, ks=(1000, 10000))}
    row["unique@1k"], row["unique@10k"] = row.pop("unique@1000", None), row.pop("unique@10000", None)
    gen = Reference(generated, test.device)
    for name, ref in (("test", test), ("testsf", test_sf)):
        m = ref.compare(gen)
        row["n_valid"], row["int_div"] = m["n_valid"], m["int_div"]
        for metric in ("fcd", "snn", "frag", "scaf"):
            row[f"{metric}/{name}"] = m[metric]
    row["int_div2"] = internal_diversity(gen.fps, p=2) if len(gen.smiles) >= 2 else None
    row["quality"] = quality(gen.smiles, len(generated))
    return row
