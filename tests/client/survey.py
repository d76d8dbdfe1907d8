"""The survey the device and report tests share: four attributes of 3, 2, 5 and 10
categories, a plan of three views and one user's record."""

from __future__ import annotations

from calmkit_client import Attribute, Plan, Schema

SCHEMA = Schema(
    (
        Attribute("age", ("<30", "30-49", "50+"), ordered=True),
        Attribute("smoker", ("no", "yes")),
        Attribute("region", tuple("NESWC")),
        Attribute("income", tuple(f"q{i}" for i in range(10))),
    )
)
# eps = 1: views of 6, 15, 30 cells -> GRR, OUE, OUE
PLAN = Plan(SCHEMA, 1.0, [["age", "smoker"], ["age", "region"], ["region", "income"]], seed=9)
RECORD = {"age": "50+", "smoker": "yes", "region": "W", "income": "q7"}
