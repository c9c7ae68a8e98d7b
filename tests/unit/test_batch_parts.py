"""The Batch API's parts without processes: JSONL validation, the lifecycle, paging, the
multipart form, the runner's retry delay, the internal credential, and the store's
transitions and exactly-once recording on a SQLite file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ingress import batch_store, batches, files, paging
from ingress.batch_lines import InputUnusable, error_of, parse_input
from ingress.batch_runner import retry_delay
from ingress.database import Database, DatabaseUrl
from ingress.internal_auth import InternalCredentials
from ingress.migrations import migrate
from ingress.multipart import FormError, parse_form

CHAT = "/v1/chat/completions"


def line(custom_id: object, **changes: object) -> str:
    item = {"custom_id": custom_id, "method": "POST", "url": CHAT,
            "body": {"model": "m", "messages": []}, **changes}
    return json.dumps(item)


def test_jsonl_validation_reports_each_bad_line_and_keeps_the_rest() -> None:
    text = "\n".join([line("a"), "", "{oops", "[1]", line(None), line(""), line("a"),
                      line("b", method="GET"), line("c", url="/v1/embeddings"),
                      line("d", body=[]), line("e", body={"messages": []}),
                      line("f", body={"model": "m", "stream": True}), line("g"), ""])
    parsed = parse_input(text, CHAT)
    codes = [(p.line, p.custom_id, p.error["code"] if p.error else None) for p in parsed]
    assert codes == [
        (1, "a", None), (3, None, "invalid_json"), (4, None, "invalid_json"),
        (5, None, "missing_custom_id"), (6, None, "missing_custom_id"),
        (7, "a", "duplicate_custom_id"), (8, "b", "invalid_method"), (9, "c", "invalid_url"),
        (10, "d", "invalid_body"), (11, "e", "invalid_body"), (12, "f", "invalid_body"),
        (13, "g", None)]
    assert json.loads(parsed[0].request or "") == {"model": "m", "messages": []}
    assert parsed[1].error is not None and "(line 3)" in parsed[1].error["message"]


def test_an_unusable_file_fails_as_a_whole() -> None:
    with pytest.raises(InputUnusable) as empty:
        parse_input("\n \n", CHAT)
    assert empty.value.code == "empty_file"
    with pytest.raises(InputUnusable) as long:
        parse_input("\n".join(line(f"x{i}") for i in range(50_001)), CHAT)
    assert long.value.code == "too_many_requests"


def test_error_of_an_answer() -> None:
    assert error_of(404, {"error": {"code": "model_not_found", "message": "no"}}) == \
        {"code": "model_not_found", "message": "no"}
    assert error_of(500, "oops")["code"] == "http_500"


def test_the_lifecycle_only_goes_forward() -> None:
    assert batches.advance(batches.VALIDATING, batches.IN_PROGRESS) == batches.IN_PROGRESS
    for status in batches.TERMINAL:
        for other in batches.STATUSES:
            assert not batches.can_advance(status, other)
    with pytest.raises(batches.IllegalTransition):
        batches.advance(batches.IN_PROGRESS, batches.VALIDATING)
    with pytest.raises(batches.IllegalTransition):
        batches.advance(batches.CANCELLING, batches.COMPLETED)
    assert batches.cancellable(batches.IN_PROGRESS)
    assert not batches.cancellable(batches.CANCELLING)
    assert not batches.cancellable(batches.COMPLETED)
    with pytest.raises(ValueError):
        batches.metadata_of({"k": 1})
    with pytest.raises(ValueError):
        batches.metadata_of({str(i): "v" for i in range(17)})


def test_paging_parameters_and_list_object() -> None:
    assert paging.limit_of(None) == 20 and paging.limit_of("100") == 100
    for bad in ("0", "101", "x", "-1"):
        with pytest.raises(ValueError):
            paging.limit_of(bad)
    assert paging.after_clause(None) == ("", [])
    clause, params = paging.after_clause((5.0, "b"))
    assert clause.count("?") == len(params) == 3
    rows, more = paging.page([1, 2, 3], 2)
    assert (rows, more) == ([1, 2], True)
    assert paging.list_object([{"id": "x"}, {"id": "y"}], False) == {
        "object": "list", "data": [{"id": "x"}, {"id": "y"}], "first_id": "x",
        "last_id": "y", "has_more": False}


def test_multipart_form() -> None:
    body = (b"--XyZ\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
            b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a b.jsonl\""
            b"\r\nContent-Type: application/octet-stream\r\n\r\n{\"x\": 1}\n\r\n--XyZ--\r\n")
    form = parse_form(body, "multipart/form-data; boundary=XyZ")
    assert form["purpose"].content == b"batch"
    assert (form["file"].filename, form["file"].content) == ("a b.jsonl", b'{"x": 1}\n')
    for content_type, data in [(None, body), ("application/json", body),
                               ("multipart/form-data", body),
                               ("multipart/form-data; boundary=XyZ", body[:40]),
                               ("multipart/form-data; boundary=XyZ", b"--XyZ\r\nnope\r\n"
                                b"--XyZ--")]:
        with pytest.raises(FormError):
            parse_form(data, content_type)


def test_retry_delay_honours_retry_after() -> None:
    assert retry_delay(1, "7") == 7.0
    assert retry_delay(1, "100000") == 600.0
    assert retry_delay(1, None, 0.5) == 0.5 and retry_delay(3, None, 0.5) == 2.0
    assert retry_delay(30, None) == 60.0
    assert retry_delay(2, "Wed, 21 Oct 2015 07:28:00 GMT", 1.0) == 2.0


def test_internal_credentials_act_for_one_key_in_one_process() -> None:
    mine, other = InternalCredentials(), InternalCredentials()
    token = mine.header("key_0123456789ab").removeprefix("Bearer ").encode()
    assert mine.key_id(token) == "key_0123456789ab"
    assert other.key_id(token) is None  # another process (or a restart)
    forged = token.replace(b"key_0123456789ab", b"key_ba9876543210")
    assert mine.key_id(forged) is None
    assert mine.key_id(b"otela-abc") is None
    assert repr(mine) == "InternalCredentials(<secret>)"  # never the secret itself


@pytest.fixture
def db(tmp_path: Path) -> Database:
    database = Database.connect(DatabaseUrl.parse(str(tmp_path / "b.db")))
    migrate(database)
    return database


def test_store_records_each_line_once_and_finishes(db: Database) -> None:
    upload = files.create(db, "key_a", "in.jsonl", "\n".join([line("a"), "{", line("b")]))
    batch = batch_store.create(db, "key_a", CHAT, upload.id, "24h", None, 100.0)
    assert batch_store.claim(db, "r1", 100.0, 30.0) == [(batch.id, "validating")]
    assert batch_store.claim(db, "r2", 110.0, 30.0) == []  # r1 holds it
    started = batch_store.start(db, batch.id, parse_input(
        files.upload_content(db, "key_a", upload.id) or "", CHAT), 101.0)
    assert (started.status, started.total, started.failed) == ("in_progress", 3, 1)
    assert [p[0] for p in batch_store.pending_lines(db, batch.id, 0, 10)] == [1, 3]
    assert batch_store.record(db, batch.id, 1, files.OK, '{"a":1}')
    assert not batch_store.record(db, batch.id, 1, files.OK, '{"a":2}')  # once only
    assert batch_store.finish(db, batch.id, 102.0) is None  # line 3 has no result
    assert batch_store.record(db, batch.id, 3, files.OK, '{"b":1}')
    done = batch_store.finish(db, batch.id, 103.0)
    assert done is not None and done.status == "completed"
    assert (done.total, done.completed, done.failed) == (3, 2, 1)
    assert files.content(db, "key_a", done.output_file_id or "") == b'{"a":1}\n{"b":1}\n'
    assert files.content(db, "key_b", done.output_file_id or "") is None
    stored = files.get(db, "key_a", done.output_file_id or "")
    assert stored is not None and stored.bytes == len(b'{"a":1}\n{"b":1}\n')
    assert done.to_dict()["completed_at"] == 103 and done.to_dict()["finalizing_at"] == 103
    assert batch_store.claim(db, "r1", 104.0, 30.0) == []  # over: nobody runs it


def test_a_lapsed_lease_passes_to_another_runner(db: Database) -> None:
    upload = files.create(db, "key_a", "in.jsonl", line("a"))
    batch = batch_store.create(db, "key_a", CHAT, upload.id, "24h", None, 100.0)
    assert batch_store.claim(db, "r1", 100.0, 30.0) == [(batch.id, "validating")]
    assert batch_store.claim(db, "r2", 131.0, 30.0) == [(batch.id, "validating")]
    assert batch_store.held(db, "r1", batch.id) is None


def test_cancel_and_expiry(db: Database) -> None:
    upload = files.create(db, "key_a", "in.jsonl", "\n".join([line("a"), line("b")]))
    cancelled = batch_store.create(db, "key_a", CHAT, upload.id, "24h", None, 100.0)
    assert batch_store.request_cancel(db, "key_b", cancelled.id, 101.0) is None
    assert batch_store.request_cancel(db, "key_a", cancelled.id, 101.0).status == \
        "cancelling"  # type: ignore[union-attr]
    after = batch_store.start(db, cancelled.id, parse_input(line("a"), CHAT), 102.0)
    assert after.status == "cancelled" and after.total == 0

    expiring = batch_store.create(db, "key_a", CHAT, upload.id, "24h", None, 100.0)
    batch_store.start(db, expiring.id, parse_input(
        "\n".join([line("a"), line("b")]), CHAT), 101.0)
    batch_store.record(db, expiring.id, 1, files.OK, "{}")
    assert batch_store.finish(db, expiring.id, 200.0) is None
    expired = batch_store.finish(db, expiring.id, 200.0, expired=True)
    assert expired is not None and expired.status == "expired"
    assert (expired.completed, expired.failed) == (1, 1)
    [unsent] = (files.content(db, "key_a", expired.error_file_id or "") or b"").splitlines()
    assert json.loads(unsent)["error"]["code"] == "batch_expired"

    failing = batch_store.create(db, "key_a", CHAT, upload.id, "24h", None, 100.0)
    batch_store.fail(db, failing.id, "empty_file", "no lines", 101.0)
    shown = batch_store.get(db, "key_a", failing.id)
    assert shown is not None and shown.status == "failed"
    assert shown.to_dict()["errors"]["data"][0]["code"] == "empty_file"


def test_listing_is_newest_first_and_per_key(db: Database) -> None:
    upload = files.create(db, "key_a", "in.jsonl", line("a"))
    made = [batch_store.create(db, "key_a", CHAT, upload.id, "24h", None, 100.0 + i // 2).id
            for i in range(5)]  # pairs share a created_at: the id breaks the tie
    batch_store.create(db, "key_b", CHAT, upload.id, "24h", None, 100.0)
    seen, after = [], None
    while True:
        page, more = batch_store.list_batches(db, "key_a", after, 2)
        seen += [b.id for b in page]
        if not more:
            break
        after = batch_store.anchor(db, "key_a", page[-1].id)
    assert sorted(seen) == sorted(made) and len(seen) == 5
    times = [batch_store.get(db, "key_a", b).created_at for b in seen]  # type: ignore[union-attr]
    assert times == sorted(times, reverse=True)
