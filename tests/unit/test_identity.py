import stat

import pytest

from otela.identity import KEY_FILE, load_or_create


def test_identity_persists_across_starts(tmp_path):
    first = load_or_create(tmp_path / "home")
    second = load_or_create(tmp_path / "home")
    assert first.peer_id == second.peer_id
    assert first.default_provider_id == second.default_provider_id
    assert first.peer_id.to_base58().startswith("12D3KooW")  # Ed25519 peer id
    mode = stat.S_IMODE((tmp_path / "home" / KEY_FILE).stat().st_mode)
    assert mode == 0o600


def test_distinct_homes_are_distinct_nodes(tmp_path):
    assert load_or_create(tmp_path / "a").peer_id != load_or_create(tmp_path / "b").peer_id


def test_corrupt_key_file_is_a_clear_error(tmp_path):
    (tmp_path / KEY_FILE).write_bytes(b"short")
    with pytest.raises(ValueError, match="32-byte"):
        load_or_create(tmp_path)
