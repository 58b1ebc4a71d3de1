"""The run's storage layer on S3 (moto's server on loopback): small files, listings, folder moves that a
re-run finishes after a kill, and the exclusive create it does not offer there."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest

from spark_apps.dlq_replay import storage

if TYPE_CHECKING:
    from collections.abc import Iterator

    from spark_standalone import S3Server

pytestmark = pytest.mark.integration


@pytest.fixture
def root(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh ``s3a://`` prefix on the S3 server, with this process's AWS settings pointing at it."""
    for key, value in s3_server.env.items():
        monkeypatch.setenv(key, value)
    storage._s3.cache_clear()
    bucket = s3_server.bucket(f"storage-{uuid.uuid4().hex[:8]}")
    yield f"s3a://{bucket}/run"
    storage._s3.cache_clear()


def test_small_files_and_listings(root: str) -> None:
    state = storage.join(root, "runs", "r1", "state.json")
    store = storage.RunStorage()
    assert store.read_text(state) is None
    store.write_text(state, "héllo")
    store.write_text(state, "again")
    assert store.read_text(state) == "again"
    assert store.list_names(storage.join(root, "runs")) == ["r1"]
    assert storage.list_files(root) == [state]
    assert store.list_names(storage.join(root, "runs", "r1"))
    store.delete(storage.join(root, "runs"))
    assert not store.exists(state)
    assert store.list_names(storage.join(root, "runs")) == []


def test_a_folder_move_cut_short_is_finished_by_the_next_call(root: str) -> None:
    staged, target = storage.join(root, "staged"), storage.join(root, "archive", "run_id=r1")
    storage.write_bytes(storage.join(target, "part-old.parquet"), b"an earlier attempt's")
    names = [f"part-{i:05d}.parquet" for i in range(3)]
    for name in names:
        storage.write_bytes(storage.join(staged, name), name.encode())
    # The first call empties the target, then is killed after moving one file.
    moved: list[str] = []
    real_move = storage.move

    def killed_after_one(src: str, dst: str) -> None:
        if moved:
            raise KeyboardInterrupt
        real_move(src, dst)
        moved.append(dst)

    storage.move = killed_after_one  # type: ignore[assignment]
    try:
        with pytest.raises(KeyboardInterrupt):
            storage.move_tree(staged, target)
    finally:
        storage.move = real_move  # type: ignore[assignment]
    storage.move_tree(staged, target)  # the re-run: nothing lost, nothing of the earlier attempt
    assert storage.list_names(target) == names
    assert [storage.read_bytes(storage.join(target, n)) for n in names] == [n.encode() for n in names]
    assert storage.list_files(staged) == []
    storage.move_tree(staged, target)  # moved already: nothing to do
    assert storage.list_names(target) == names


def test_no_exclusive_create_on_object_storage(root: str) -> None:
    with pytest.raises(storage.StorageError, match="--subscription-lease on"):
        storage.RunStorage().create_exclusive(storage.join(root, "locks", "lock-1"), "me")


def test_a_missing_bucket_is_named_before_any_work(root: str) -> None:
    storage.check_root(root)
    with pytest.raises(storage.StorageError, match="bucket 'no-such-bucket' does not exist"):
        storage.check_root("s3://no-such-bucket/dlq")
