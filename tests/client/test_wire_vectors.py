"""The wire protocol's test vectors (docs/wire-vectors.json): current with the Python
client, and recomputed here from docs/wire-protocol.md's recipes alone (json, hashlib,
xxhash and integer arithmetic; no calmkit code), so the page is enough to write a
client in another language."""

from __future__ import annotations

import hashlib
import json
import math
import runpy
from fractions import Fraction
from pathlib import Path

import pytest
import xxhash

DOCS = Path(__file__).resolve().parents[2] / "docs"
VECTORS = json.loads((DOCS / "wire-vectors.json").read_text(encoding="utf-8"))
TWO64 = 1 << 64


def test_the_vectors_are_current() -> None:
    generator = runpy.run_path(str(DOCS / "wire_vectors.py"))
    assert (DOCS / "wire-vectors.json").read_text(encoding="utf-8") == generator["render"](), (
        "docs/wire-vectors.json is out of date: run python docs/wire_vectors.py"
    )


def _canonical(plan: dict) -> str:
    """The page's recipe: hex floats, shares normalised, keys sorted, no spaces,
    non-ASCII escaped."""
    total = math.fsum(plan["shares"])
    obj = {
        "format": plan["format"],
        "schema": plan["schema"],
        "epsilon": float(plan["epsilon"]).hex(),
        "views": plan["views"],
        "oracles": plan["oracles"],
        "shares": [(s / total).hex() for s in plan["shares"]],
        "seed": plan["seed"],
    }
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


@pytest.mark.parametrize("case", VECTORS["plans"], ids=lambda c: c["digest"][:12])
def test_plan_digest_from_the_recipe(case: dict) -> None:
    text = _canonical(case["plan"])
    assert text == case["canonical_json"]
    assert hashlib.sha256(text.encode("utf-8")).hexdigest() == case["digest"]
    assert case["plan"]["digest"] == case["digest"]
    assert text.isascii()


def _plan_by_digest(digest: str) -> dict:
    return next(c["plan"] for c in VECTORS["plans"] if c["digest"] == digest)


def _encode(case: dict) -> bytes:
    if case["kind"] == "int":
        return int(case["user_id"]).to_bytes(8, "little")
    if case["kind"] == "str":
        return str(case["user_id"]).encode("utf-8")
    return bytes.fromhex(case["user_id"])


@pytest.mark.parametrize("case", VECTORS["assignment"], ids=lambda c: f"{c['kind']}-{c['user_id']}")
def test_view_assignment_from_the_recipe(case: dict) -> None:
    plan = _plan_by_digest(case["plan_digest"])
    encoded = _encode(case)
    assert encoded.hex() == case["encoded_hex"]
    h = xxhash.xxh64_intdigest(encoded, seed=plan["seed"])
    assert str(h) == case["xxh64"]
    cumulative, bounds = 0.0, []
    for share in plan["shares"][:-1]:
        cumulative += share
        bounds.append(min(int(cumulative * 2.0**64), TWO64 - 1))
    assert sum(b <= h for b in bounds) == case["view"]


def test_the_assignment_vectors_reach_every_view() -> None:
    assert {c["view"] for c in VECTORS["assignment"]} == {0, 1, 2}


@pytest.mark.parametrize("case", VECTORS["cells"], ids=lambda c: f"{c['record']}-{c['view']}")
def test_cell_from_the_recipe(case: dict) -> None:
    plan = _plan_by_digest(case["plan_digest"])
    attrs = plan["schema"]["attributes"]
    codes = [a["categories"].index(label) for a, label in zip(attrs, case["record"])]
    assert codes == case["codes"]
    cell, stride = 0, 1
    for a in reversed(plan["views"][case["view"]]):  # C order: the last varies fastest
        cell += codes[a] * stride
        stride *= len(attrs[a]["categories"])
    assert cell == case["cell"]


@pytest.mark.parametrize("case", VECTORS["oue_payloads"], ids=lambda c: f"L{c['L']}")
def test_oue_packing_from_the_recipe(case: dict) -> None:
    payload = bytearray((case["L"] + 7) // 8)
    for c in case["ones"]:
        payload[c // 8] |= 1 << (7 - c % 8)
    assert payload.hex() == case["payload_hex"]


@pytest.mark.parametrize(
    "case", VECTORS["thresholds"], ids=lambda c: f"eps{c['epsilon']}-L{c['L']}"
)
def test_sampling_thresholds_from_the_recipe(case: dict) -> None:
    e, L = math.exp(case["epsilon"]), case["L"]

    def rounded(prob: float) -> int:
        return int(Fraction(prob) * TWO64 + Fraction(1, 2))

    Q = max(1, rounded(1.0 / (e + L - 1)))
    assert str(Q) == case["grr_Q"] and str(TWO64 - (L - 1) * Q) == case["grr_K"]
    assert str(rounded(1.0 / (e + 1.0))) == case["oue_T"]
    # the privacy loss realised by the integers is epsilon
    assert math.log((TWO64 - (L - 1) * Q) / Q) == pytest.approx(case["epsilon"], rel=1e-12)
