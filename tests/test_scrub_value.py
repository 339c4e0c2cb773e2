"""The Python twin of the erase's painless walk (service/storage/erasure.py ``scrub_value``): what
an erase does to records waiting in Redis."""

from __future__ import annotations

from service.storage.erasure import REDACTED, needles, scrub_value


def test_every_string_outside_the_kept_fields_is_redacted_and_counted() -> None:
    wanted = needles(['The vault "opens" at one'])
    record = {
        "tenant_id": 'The vault "opens" at one',  # an identifier that equals the text: kept
        "user_message": 'Remember: The vault "opens" at one.',
        "details": {"quoted": ['x The vault "opens" at one', 7, None], "turn_ids": ['The vault "opens" at one']},
        "sidecar_raw": '{"content": "The vault \\"opens\\" at one"}',  # JSON-escaped inside a string
    }
    scrubbed, hits = scrub_value(record, wanted)
    assert hits == 3
    assert scrubbed["tenant_id"] == record["tenant_id"]
    assert scrubbed["user_message"] == f"Remember: {REDACTED}."
    assert scrubbed["details"] == {"quoted": [f"x {REDACTED}", 7, None], "turn_ids": record["details"]["turn_ids"]}
    assert scrubbed["sidecar_raw"] == f'{{"content": "{REDACTED}"}}'


def test_nothing_to_redact_changes_nothing() -> None:
    record = {"user_message": "unrelated", "n": 1}
    assert scrub_value(record, needles(["The vault opens at one"])) == (record, 0)
    assert scrub_value(record, needles(["short"])) == (record, 0)  # under MIN_NEEDLE_CHARS: no needle
