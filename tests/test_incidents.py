"""The incident vocabulary: every kind has a family, a severity and a next step; what the store
and the API write are plain strings, and a stored incident finds its episode again."""

from __future__ import annotations


def test_every_incident_kind_has_a_family_a_severity_and_a_next_step_as_plain_strings():
    from hangd.analysis.model import Strength
    from hangd.incidents import (
        FAMILY,
        NEXT_STEP,
        SEVERITY,
        Family,
        IncidentBook,
        IncidentKind,
        Severity,
    )

    for kind in IncidentKind:
        assert isinstance(FAMILY[kind], Family) and isinstance(SEVERITY[kind], Severity) and NEXT_STEP[kind]
    book = IncidentBook()
    d = book.open_incident(IncidentKind.STRAGGLER, "job", 1.0).to_dict()
    assert type(d["kind"]) is str and type(d["severity"]) is str  # what the store and the API write
    assert (d["kind"], d["severity"]) == ("straggler", "warning")
    # a stored incident (plain strings) finds its episode again after a restart
    book2 = IncidentBook()
    book2.adopt({**d, "resolved_at": None})
    assert book2.open_incident("straggler", "job", 2.0).id == d["id"]
    assert Strength.FLIGHT_RECORDER > Strength.STOPPED > Strength.STACK > Strength.INFERRED
