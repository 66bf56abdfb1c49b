"""Each connection's cluster, for the checks that compare connections: its own answers', else
its upstream address's, else the audit's only one, else none and apart per address."""

from __future__ import annotations

from spark_audit.checks._clusters import KEY, Clusters, by_connection
from tests.support.audit_builders import connection_fact, fact, facts_df


def clusters(spark, homes: list[dict]) -> dict[str, tuple]:
    """``cluster_id`` and :data:`KEY` of a fact on each connection of ``homes``, and on ``z``
    (no ``connection`` fact)."""
    seen = [
        fact(c, 1, "group", direction="request", api_key=9, cid=1)
        for c in [*(h["connection_id"] for h in homes), "z"]
    ]
    facts = facts_df(spark, homes + seen)
    rows = by_connection(facts.filter("fact = 'group'"), facts, Clusters.of(facts)).collect()
    return {r.connection_id: (r.cluster_id, r[KEY]) for r in rows}


def test_a_connection_takes_its_own_cluster_else_its_addresss(spark):
    got = clusters(
        spark,
        [
            connection_fact("ma", "a1:9092", "A"),
            connection_fact("ca", "a1:9092"),
            connection_fact("mb", "b1:9092", "B"),
            connection_fact("mb2", "a1:9092", "B"),  # a1 named two clusters: it names none
            connection_fact("cb", "b1:9092"),
            connection_fact("x", "x1:9092"),
        ],
    )
    assert got == {
        "ma": ("A", "A"),
        "ca": (None, "@a1:9092"),
        "mb": ("B", "B"),
        "mb2": ("B", "B"),
        "cb": ("B", "B"),
        "x": (None, "@x1:9092"),
        "z": (None, ""),
    }


def test_with_one_cluster_every_connection_is_its(spark):
    got = clusters(spark, [connection_fact("ma", "a1:9092", "A"), connection_fact("x", "x1:9092")])
    assert got == {"ma": ("A", "A"), "x": ("A", "A"), "z": ("A", "A")}
    assert clusters(spark, [connection_fact("x", "x1:9092")]) == {"x": (None, ""), "z": (None, "")}


def test_the_homes_are_resolved_on_the_driver_by_the_same_rules():
    homes = [("a1:9092", "A"), ("a1:9092", None), ("b1:9092", "B"), ("a1:9092", "B"), ("x1:9092", None)]
    resolved = Clusters.of_homes(homes)
    assert not resolved.single
    assert resolved.homes == {
        ("a1:9092", "A"): ("A", "A"),
        ("a1:9092", None): (None, "@a1:9092"),  # a1 named two clusters: it names none
        ("b1:9092", "B"): ("B", "B"),
        ("a1:9092", "B"): ("B", "B"),
        ("x1:9092", None): (None, "@x1:9092"),
        (None, None): (None, ""),  # a connection without a connection fact
    }
    one = Clusters.of_homes([("a1:9092", "A"), ("x1:9092", None)])
    assert one.single and one.only == "A" and one.homes[("x1:9092", None)] == ("A", "A")
    assert Clusters.of_homes([]) == Clusters({(None, None): (None, "")}, True, None)
