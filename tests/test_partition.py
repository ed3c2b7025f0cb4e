"""Partitions: disjointness, sizes, label structure, determinism, the min-size repair against its plain
reference, errors (their speed at 10,000-100,000 clients: benchmarks/partition_scale.py)."""

import json

import numpy as np
import pytest

from fedjax_pfl.data import partition as P
from fedjax_pfl.core.errors import UserError


def _pool(per_class=700, num_classes=10, seed=0):
    labels = np.repeat(np.arange(num_classes), per_class)
    np.random.default_rng(seed).shuffle(labels)
    return labels


LABELS = _pool()
SCHEME_PARAMS = {
    "iid": {},
    "dirichlet": {"alpha": 0.3},
    "pathological": {"classes_per_client": 2},
    "practical": {"num_groups": 5, "dominant_classes_per_group": 3,
                  "uniform_fraction": 0.2, "samples_per_client": 200},
}


def _assert_disjoint(parts, n):
    flat = np.concatenate(parts)
    assert all(p.dtype == np.int64 for p in parts)
    assert np.unique(flat).size == flat.size, "an index is used twice"
    assert flat.min() >= 0 and flat.max() < n
    return flat


def _hist(parts, labels=LABELS, c=10):
    return P.label_histograms(parts, labels, c)


@pytest.mark.parametrize("scheme", sorted(SCHEME_PARAMS))
def test_disjoint_deterministic_and_seed_dependent(scheme):
    params = SCHEME_PARAMS[scheme]
    a = P.make_partition(scheme, LABELS, 20, seed=1, **params)
    b = P.make_partition(scheme, LABELS, 20, seed=1, **params)
    c = P.make_partition(scheme, LABELS, 20, seed=2, **params)
    assert len(a) == 20
    flat = _assert_disjoint(a, LABELS.size)
    if scheme != "practical":  # practical leaves undrawn samples unused
        np.testing.assert_array_equal(np.sort(flat), np.arange(LABELS.size))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_iid_sizes_and_mix():
    parts = P.iid(LABELS, 13, seed=0)
    sizes = np.array([len(p) for p in parts])
    assert sizes.max() - sizes.min() <= 1 and sizes.sum() == LABELS.size
    assert (_hist(parts) > 0).all()


def test_dirichlet_skew_grows_as_alpha_shrinks():
    def mean_max_share(alpha):
        h = _hist(P.dirichlet(LABELS, 20, alpha, seed=0))
        return (h.max(1) / h.sum(1)).mean()
    skewed, flat = mean_max_share(0.05), mean_max_share(100.0)
    assert skewed > 0.7
    assert flat < 0.2  # uniform share is 0.1
    summ = P.summary(P.dirichlet(LABELS, 20, 0.05, seed=0), LABELS, 10)
    assert summ["train"]["mean_max_class_share"] == pytest.approx(skewed)


def test_dirichlet_10000_clients_alpha_0_01_lifts_every_client_and_uses_the_whole_pool():
    """The cross-device shape: nearly every client draws (almost) nothing and the repair lifts each one (its
    time at 10,000 and 100,000 clients: benchmarks/partition_scale.py)."""
    labels = _pool(per_class=20_000)
    parts = P.dirichlet(labels, 10_000, 0.01, seed=0, min_size=10)
    sizes = np.array([len(p) for p in parts])
    assert sizes.min() == 10 and (sizes == 10).mean() > 0.5, "alpha 0.01: most clients are lifted to min_size"
    flat = _assert_disjoint(parts, labels.size)
    assert flat.size == labels.size
    top = P.dirichlet(labels, 10_000, 0.01, seed=0, min_size=10, max_classes_per_client=2)
    h = _hist(top, labels)
    assert h.sum(1).min() == 10 and ((h > 0).sum(1) <= 2).all()
    _assert_disjoint(top, labels.size)


def _reference_lift(owner, num_clients, min_size, rng):
    """The repair written plainly (a pass over the pool per move): what `lift_small_clients` must equal."""
    sizes = np.bincount(owner, minlength=num_clients)
    for r in np.flatnonzero(sizes < min_size):
        while sizes[r] < min_size:
            donor = int(np.argmax(sizes))
            give = min(min_size - sizes[r], sizes[donor] - min_size)
            owner[rng.choice(np.flatnonzero(owner == donor), give, replace=False)] = r
            sizes[donor] -= give
            sizes[r] += give


def _reference_lift_top_k(owner, labels, num_clients, num_classes, k, min_size, rng):
    """The top-k repair written plainly: what `lift_small_clients_top_k` must equal."""
    used = owner >= 0
    hist = np.bincount(owner[used] * num_classes + labels[used], minlength=num_clients * num_classes)
    hist = hist.reshape(num_clients, num_classes)
    unused = np.bincount(labels[owner < 0], minlength=num_classes)
    stuck = []
    for r in np.flatnonzero(hist.sum(1) < min_size):
        while (need := min_size - int(hist[r].sum())) > 0:
            held = hist[r] > 0
            allowed = held if held.sum() >= k else np.ones(num_classes, bool)
            sizes = hist.sum(1)
            free = np.where(allowed & (unused > 0), unused + held * labels.size, 0)
            if free.max() > 0:
                c = int(np.argmax(free))
                pool, give = np.flatnonzero((owner < 0) & (labels == c)), min(need, int(unused[c]))
                unused[c] -= give
            else:
                spare = np.minimum(hist, np.maximum(sizes - min_size, 0)[:, None]) * allowed
                spare[r] = 0
                donor, c = np.unravel_index(int(np.argmax(spare)), spare.shape)
                if spare[donor, c] == 0:
                    stuck.append(int(r))
                    break
                pool, give = np.flatnonzero((owner == donor) & (labels == c)), min(need, int(spare[donor, c]))
                hist[donor, c] -= give
            owner[rng.choice(pool, give, replace=False)] = r
            hist[r, c] += give
    return stuck


@pytest.mark.parametrize("seed", range(12))
def test_the_repair_equals_its_plain_reference(seed):
    """The fast repair (data/min_size_repair.py: heaps and ranked pools, no pass over the pool per move) moves
    exactly the samples of the plain loop, so partitions drawn before it are drawn again unchanged."""
    from fedjax_pfl.data import min_size_repair

    rng = np.random.default_rng(seed)
    num_clients, num_classes = int(rng.integers(2, 300)), int(rng.integers(2, 12))
    labels = rng.integers(0, num_classes, int(rng.integers(num_clients, 40 * num_clients)))
    skew = rng.dirichlet(np.full(num_clients, 0.05))
    owner = rng.choice(num_clients, labels.size, p=skew)
    min_size = int(rng.integers(1, max(2, labels.size // num_clients)))
    fast, plain = owner.copy(), owner.copy()
    min_size_repair.lift_small_clients(fast, num_clients, min_size, np.random.default_rng(seed))
    _reference_lift(plain, num_clients, min_size, np.random.default_rng(seed))
    np.testing.assert_array_equal(fast, plain)
    assert np.bincount(fast, minlength=num_clients).min() >= min_size

    k = int(rng.integers(1, num_classes))
    unused = rng.random(labels.size) < rng.uniform(0, 0.6)
    owner = np.where(unused, -1, owner)
    min_size = int(rng.integers(1, max(2, 2 * labels.size // num_clients)))
    fast, plain = owner.copy(), owner.copy()
    stuck = min_size_repair.lift_small_clients_top_k(fast, labels, num_clients, num_classes, k, min_size,
                                                     np.random.default_rng(seed))
    assert stuck.tolist() == _reference_lift_top_k(plain, labels, num_clients, num_classes, k, min_size,
                                                   np.random.default_rng(seed))
    np.testing.assert_array_equal(fast, plain)


def test_ranked_pool_takes_by_rank_among_the_samples_left():
    from fedjax_pfl.data.min_size_repair import RankedPool

    rng = np.random.default_rng(0)
    samples = np.sort(rng.choice(100_000, 5_000, replace=False))
    pool, left = RankedPool(samples), list(samples)
    while left:
        ranks = rng.choice(len(left), min(len(left), int(rng.integers(1, 40))), replace=False)
        assert pool.take(ranks).tolist() == [left[r] for r in ranks]
        left = [s for i, s in enumerate(left) if i not in set(ranks.tolist())]
        assert pool.size == len(left)


def test_a_top_k_split_that_cannot_reach_min_size_says_so():
    """Two classes of 30 samples, one class a client: 4 clients of 20 cannot all be lifted."""
    labels = np.repeat([0, 1], 30)
    with pytest.raises(UserError, match=r"max_classes_per_client=1: \d+ client\(s\) cannot reach min_size 20 "
                                        r"\(client \d+ holds \d+\).*lower min_size, raise max_classes_per_client"):
        P.dirichlet(labels, 3, 0.5, seed=0, min_size=20, max_classes_per_client=1)


def test_the_scale_benchmark_prints_a_record_per_scheme_and_the_growth():
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "partition_scale.py"
    proc = subprocess.run([sys.executable, str(script), "--clients", "100,200", "--per-client", "30"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    records, growth = rows[:-1], rows[-1]
    assert len(records) == 12 and {r["workload"]["clients"] for r in records} == {100, 200}
    for r in records:
        assert r["partition_s"] >= 0 and r["split_train_test_s"] >= 0 and r["peak_memory_bytes"] > 0
        assert r["smallest_client"] >= (10 if r["workload"]["scheme"].startswith("dirichlet") else 1)
    assert set(growth) - {"growth"} == {r["workload"]["scheme"] for r in records}


def test_dirichlet_min_size_repair_keeps_everything():
    parts = P.dirichlet(LABELS, 50, 0.1, seed=3, min_size=100)
    assert min(len(p) for p in parts) >= 100
    assert sum(len(p) for p in parts) == LABELS.size


@pytest.mark.parametrize("k", [1, 2, 3])
def test_dirichlet_top_k_classes_at_most_k_per_client_and_min_size(k):
    labels = _pool(per_class=2000)
    parts = P.dirichlet(labels, 1000, 0.1, seed=0, min_size=10, max_classes_per_client=k)
    assert len(parts) == 1000
    h = _hist(parts, labels)
    assert ((h > 0).sum(1) <= k).all()
    assert h.sum(1).min() >= 10
    _assert_disjoint(parts, labels.size)


def test_dirichlet_top_k_keeps_each_clients_largest_classes_and_is_seeded():
    plain = _hist(P.dirichlet(LABELS, 20, 0.5, seed=1, min_size=0))
    top2 = P.dirichlet(LABELS, 20, 0.5, seed=1, min_size=0, max_classes_per_client=2)
    h = _hist(top2)
    keep = np.zeros_like(plain, bool)
    np.put_along_axis(keep, np.argsort(-plain, axis=1, kind="stable")[:, :2], True, axis=1)
    assert (h == np.where(keep, plain, 0)).all(), "min_size 0: exactly each client's two largest classes"
    again = P.dirichlet(LABELS, 20, 0.5, seed=1, min_size=0, max_classes_per_client=2)
    other = P.dirichlet(LABELS, 20, 0.5, seed=2, min_size=0, max_classes_per_client=2)
    assert all((a == b).all() for a, b in zip(top2, again))
    assert any(a.shape != b.shape or (a != b).any() for a, b in zip(top2, other))


@pytest.mark.parametrize("k", [10, 12])
def test_dirichlet_top_k_of_all_classes_is_the_plain_partition(k):
    plain = P.dirichlet(LABELS, 50, 0.1, seed=3, min_size=100)
    top = P.dirichlet(LABELS, 50, 0.1, seed=3, min_size=100, max_classes_per_client=k)
    assert all((a == b).all() for a, b in zip(plain, top))


@pytest.mark.parametrize("k", [1, 2, 3, 10])
def test_pathological_exact_classes(k):
    parts = P.pathological(LABELS, 20, k, seed=0)
    h = _hist(parts)
    assert ((h > 0).sum(1) == k).all()
    assert (h.sum(0) > 0).all(), "every class is held by some client"
    held = (h > 0).sum(0)
    assert held.max() - held.min() <= 1, "class use is balanced"


def test_pathological_fewer_slots_than_classes():
    parts = P.pathological(LABELS, 3, 2, seed=0)  # 6 slots, 10 classes
    h = _hist(parts)
    assert ((h > 0).sum(1) == 2).all() and ((h.sum(0) > 0).sum() == 6)
    _assert_disjoint(parts, LABELS.size)


@pytest.mark.parametrize("s,groups,d", [(0.2, 5, 3), (0.2, 3, 3), (0.5, 5, 2)])
def test_practical_dominant_share(s, groups, d):
    m = 200
    parts = P.practical(LABELS, 20, groups, d, s, m, seed=0)
    assert all(len(p) == m for p in parts)
    _assert_disjoint(parts, LABELS.size)
    h = _hist(parts)
    dom = P.default_dominant_classes(10, groups, d)
    for i in range(20):
        share = h[i, dom[i % groups]].sum() / m
        assert share == pytest.approx((1 - s) + s * d / 10, abs=0.02)
        assert (h[i] > 0).all(), "the uniform part spans all classes"


def test_practical_fedpac_groups_and_explicit_groups():
    assert P.default_dominant_classes(10, 5, 3) == [[0, 1, 2], [2, 3, 4], [4, 5, 6], [6, 7, 8], [8, 9, 0]]
    assert P.default_dominant_classes(10, 3, 3) == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    parts = P.practical(LABELS, 4, 2, None, 0.0, 100, seed=0, dominant_classes=[[9], [0, 5]])
    h = _hist(parts)
    assert h[0, 9] == 100 and h[2, 9] == 100 and h[1, 0] == 50 and h[1, 5] == 50


def test_practical_runs_out():
    with pytest.raises(UserError, match="samples_per_client"):
        P.practical(LABELS, 20, 5, 3, 0.2, 1000, seed=0)


def test_split_train_test_stratified():
    parts = P.dirichlet(LABELS, 10, 0.5, seed=0)
    train, test = P.split_train_test(parts, LABELS, 0.75, seed=0)
    for p, tr, te in zip(parts, train, test):
        assert np.array_equal(np.sort(np.concatenate([tr, te])), p)
        assert len(tr) == round(0.75 * len(p))
    htr, hte, hall = _hist(train), _hist(test), _hist(parts)
    both = hall >= 2
    assert ((htr > 0) & (hte > 0))[both].all(), "each class with >=2 samples is on both sides"
    ptr = htr / htr.sum(1, keepdims=True)
    pte = hte / hte.sum(1, keepdims=True)
    np.testing.assert_allclose(ptr, pte, atol=0.01)


def test_sample_per_client_exact_and_stratified():
    parts = P.dirichlet(LABELS, 10, 0.3, seed=0, min_size=400)
    train, test = P.sample_per_client(parts, LABELS, 300, 100, seed=0)
    for p, tr, te in zip(parts, train, test):
        assert len(tr) == 300 and len(te) == 100
        assert np.isin(tr, p).all() and np.isin(te, p).all() and not np.isin(tr, te).any()
    pool = _hist(parts) / np.array([len(p) for p in parts])[:, None]
    np.testing.assert_allclose(_hist(train) / 300, pool, atol=0.02)
    np.testing.assert_allclose(_hist(test) / 100, pool, atol=0.05)
    again, _ = P.sample_per_client(parts, LABELS, 300, 100, seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(train, again))
    only_train, empty = P.sample_per_client(parts, LABELS, 350, seed=0)
    assert all(len(a) == 350 for a in only_train) and all(len(e) == 0 for e in empty)


def test_sample_per_client_too_small():
    parts = P.iid(LABELS, 10, seed=0)  # 700 each
    with pytest.raises(UserError, match="fewer than n_train"):
        P.sample_per_client(parts, LABELS, 600, 200, seed=0)


def test_distribute_test_follows_train_distribution():
    train = P.dirichlet(LABELS, 10, 0.5, seed=0)
    test_labels = _pool(per_class=200, seed=1)
    test = P.distribute_test_by_label_distribution(train, LABELS, test_labels, seed=0)
    _assert_disjoint(test, test_labels.size)
    htr, hte = _hist(train), _hist(test, test_labels)
    assert hte.sum() == test_labels.size  # every class is held in train, so all are dealt
    np.testing.assert_allclose(hte / hte.sum(1, keepdims=True), htr / htr.sum(1, keepdims=True),
                               atol=0.02)
    fixed = P.distribute_test_by_label_distribution(train, LABELS, test_labels, 0, test_per_client=50)
    assert [len(t) for t in fixed] == [50] * 10
    assert ((_hist(fixed, test_labels) > 0) <= (htr > 0)).all()


def test_distribute_test_shortage_shrinks_and_warns():
    train = P.pathological(LABELS, 10, 1, seed=0)  # one class per client
    test_labels = _pool(per_class=30, seed=1)
    with pytest.warns(UserWarning, match="ran out"):
        test = P.distribute_test_by_label_distribution(train, LABELS, test_labels, 0, test_per_client=40)
    _assert_disjoint(test, test_labels.size)
    assert [len(t) for t in test] == [30] * 10


def test_summary_json_and_table():
    train, test = P.split_train_test(P.iid(LABELS, 12, seed=0), LABELS, 0.75, seed=0)
    s = P.summary(train, LABELS, 10, test, info={"scheme": "iid", "seed": 0})
    s2 = json.loads(json.dumps(s))
    assert s2["train"]["sizes"] == [len(t) for t in train]
    assert s2["test"]["histograms"] == _hist(test).tolist()
    text = P.format_summary(s, max_rows=5)
    assert "12 clients" in text and "7 more clients" in text and "scheme=iid" in text


@pytest.mark.parametrize("call,match", [
    (lambda: P.make_partition("shards", LABELS, 10, 0), "choose one of"),
    (lambda: P.make_partition("dirichlet", LABELS, 10, 0), "missing: \\['alpha'\\]"),
    (lambda: P.make_partition("iid", LABELS, 10, 0, alpha=1.0), "unknown: \\['alpha'\\]"),
    (lambda: P.dirichlet(LABELS, 10, 0.0, 0), "alpha must be > 0"),
    (lambda: P.dirichlet(LABELS, 10, -1.0, 0), "alpha must be > 0"),
    (lambda: P.dirichlet(LABELS, 1000, 0.5, 0, min_size=10), "lower min_size"),
    (lambda: P.dirichlet(LABELS, 10, 0.5, 0, max_classes_per_client=0), "max_classes_per_client"),
    (lambda: P.iid(LABELS, 0, 0), "positive integer"),
    (lambda: P.iid(LABELS[:5], 6, 0), "fewer clients"),
    (lambda: P.pathological(LABELS, 10, 11, 0), "classes_per_client must be in \\[1, 10\\]"),
    (lambda: P.pathological(np.repeat([0, 1], [3, 50]), 20, 2, 0), "class 0 has 3 samples"),
    (lambda: P.practical(LABELS, 10, 2, 11, 0.2, 10, 0), "dominant_classes_per_group"),
    (lambda: P.practical(LABELS, 10, 2, 2, 1.5, 10, 0), "uniform_fraction"),
    (lambda: P.split_train_test([np.arange(10)], LABELS, 1.0), "train_fraction"),
    (lambda: P.iid(np.array([0.5, 1.0]), 1, 0), "integers"),
])
def test_bad_requests_raise_user_error(call, match):
    with pytest.raises(UserError, match=match):
        call()


def test_max_classes_per_client_needs_the_dirichlet_scheme():
    from fedjax_pfl.runs import config

    cfg = config.build(overrides=["partition.scheme=iid", "partition.max_classes_per_client=2"])
    with pytest.raises(UserError, match="applies to partition.scheme=dirichlet or client_dirichlet only"):
        config.validate_values(cfg)
    config.validate_values(config.build(overrides=["partition.max_classes_per_client=2"]))


# ------------------------------------------------------ client_dirichlet (pFedKD-WCL's authors) --

MNIST_LIKE = _pool(per_class=6000)


def test_client_dirichlet_sizes_are_the_linspace_and_at_most_k_classes():
    parts = P.client_dirichlet(MNIST_LIKE, 20, 0.5, (1165, 3834), seed=0, max_classes_per_client=3)
    assert [len(p) for p in parts] == np.linspace(1165, 3834, 20, dtype=int).tolist()
    h = _hist(parts, MNIST_LIKE)
    assert ((h > 0).sum(1) <= 3).all()
    assert ((h > 0).sum(1) == 3).any(), "alpha 0.5: some client keeps three classes"
    one = _hist(P.client_dirichlet(MNIST_LIKE, 20, 0.5, (1165, 3834), seed=0, max_classes_per_client=1), MNIST_LIKE)
    assert ((one > 0).sum(1) == 1).all()


def test_client_dirichlet_overlap_as_the_authors_never_within_a_client():
    """Each client draws without replacement from whole class pools, independently of the others."""
    parts = P.client_dirichlet(MNIST_LIKE, 20, 0.5, (1165, 3834), seed=1, max_classes_per_client=3)
    assert all(np.unique(p).size == p.size and p.min() >= 0 and p.max() < MNIST_LIKE.size for p in parts)
    # 5 clients of 60 samples, one class each from 2 classes of 100: three share a class, 180 > 100
    tiny = np.repeat([0, 1], 100)
    small = P.client_dirichlet(tiny, 5, 0.5, (60, 60), seed=0, max_classes_per_client=1)
    flat = np.concatenate(small)
    assert np.unique(flat).size < flat.size, "clients share samples"
    train, test = P.split_train_test(parts, MNIST_LIKE, 0.75, seed=2)
    for p, tr, te in zip(parts, train, test):
        assert not np.isin(tr, te).any() and np.array_equal(np.sort(np.concatenate([tr, te])), p)


def test_client_dirichlet_disjoint_shares_no_sample_and_keeps_each_mix():
    """disjoint (the pFedKD-WCL paper's reading): no sample in two clients; a client's class counts are the
    independent draw's, cut in proportion where a class is asked for beyond its pool (here: 20 clients of
    1,165-3,834 from 60,000, top 2 classes, oversubscribe some classes)."""
    parts = P.client_dirichlet(MNIST_LIKE, 20, 0.5, (1165, 3834), seed=0, max_classes_per_client=2, disjoint=True)
    flat = np.concatenate(parts)
    assert np.unique(flat).size == flat.size and flat.max() < MNIST_LIKE.size
    asked = P.client_class_counts(MNIST_LIKE, 20, 0.5, (1165, 3834), seed=0, max_classes_per_client=2)
    got = _hist(parts, MNIST_LIKE)
    assert asked.sum(1).tolist() == np.linspace(1165, 3834, 20, dtype=int).tolist()
    assert np.all(got <= asked) and np.all((got > 0) <= (asked > 0))  # the same classes, never more of one
    supply = np.bincount(MNIST_LIKE)
    short = asked.sum(0) > supply
    assert short.any() and np.array_equal(got.sum(0)[~short], asked.sum(0)[~short])
    assert np.all(got.sum(0)[short] <= supply[short]) and np.all(got.sum(0)[short] > 0.99 * supply[short] - 20)
    for c in np.flatnonzero(short):  # each client keeps floor(its ask x supply / demand)
        np.testing.assert_array_equal(got[:, c], np.floor(asked[:, c] * supply[c] / asked[:, c].sum()))


def test_client_dirichlet_is_seeded():
    a = P.make_partition("client_dirichlet", MNIST_LIKE, 20, 3, alpha=0.05, size_range=[1165, 3834],
                         max_classes_per_client=3)
    b = P.client_dirichlet(MNIST_LIKE, 20, 0.05, (1165, 3834), seed=3, max_classes_per_client=3)
    c = P.client_dirichlet(MNIST_LIKE, 20, 0.05, (1165, 3834), seed=4, max_classes_per_client=3)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


@pytest.mark.parametrize("call,match", [
    (lambda: P.client_dirichlet(MNIST_LIKE, 20, 0.5, (3834, 1165), 0), "1 <= smallest <= largest"),
    (lambda: P.client_dirichlet(MNIST_LIKE, 20, 0.5, (0, 10), 0), "1 <= smallest <= largest"),
    (lambda: P.client_dirichlet(MNIST_LIKE, 20, 0.5, (10,), 0), "two whole numbers"),
    (lambda: P.client_dirichlet(MNIST_LIKE, 20, 0.0, (10, 20), 0), "alpha must be > 0"),
    (lambda: P.client_dirichlet(MNIST_LIKE, 20, 0.5, (10, 20), 0, max_classes_per_client=0), "max_classes"),
    (lambda: P.client_dirichlet(MNIST_LIKE, 2, 0.5, (10, 19000), 0, max_classes_per_client=3),
     "cannot be drawn from at most 3 classes"),
    (lambda: P.client_dirichlet(MNIST_LIKE, 2, 0.01, (10, 9000), 0, max_classes_per_client=3),
     "samples of class .* but the pool has 6000; lower size_range"),
    (lambda: P.make_partition("client_dirichlet", MNIST_LIKE, 20, 0, alpha=0.5), "missing: \\['size_range'\\]"),
])
def test_client_dirichlet_settings_it_cannot_satisfy(call, match):
    with pytest.raises(UserError, match=match):
        call()


@pytest.mark.parametrize("overrides,match", [
    (["partition.scheme=client_dirichlet"], "partition.size_range is needed by partition.scheme=client_dirichlet"),
    (["partition.size_range=[10, 20]"], "partition.size_range applies to partition.scheme=client_dirichlet only"),
    (["partition.scheme=client_dirichlet", "partition.size_range=[20, 10]"], "1 <= smallest <= largest"),
    (["partition.test_from=train"], "partition.test_from must be one of: split, split_train, official"),
    (["data.synthetic_size_factor=5"], "applies to data.name=synthetic only"),
])
def test_client_dirichlet_config_errors(overrides, match):
    from fedjax_pfl.runs import config

    with pytest.raises(UserError, match=match):
        config.validate_values(config.build(overrides=overrides))


def test_split_train_partitions_the_train_set_only_and_is_recorded():
    """The authors' data: client_dirichlet on the official train set, each client split 75/25."""
    from fedjax_pfl.data.dataset import Dataset
    from fedjax_pfl.runs import config, experiment

    y_train = _pool(per_class=300)
    y_test = _pool(per_class=50, seed=1)
    ds = Dataset("toy", np.arange(y_train.size, dtype=np.float32)[:, None], y_train.astype(np.int32),
                 -np.ones((y_test.size, 1), np.float32), y_test.astype(np.int32), 10, (0.0,), (1.0,))
    cfg = config.build(overrides=["partition.scheme=client_dirichlet", "partition.size_range=[100, 200]",
                                  "partition.max_classes_per_client=3", "partition.test_from=split_train",
                                  "partition.num_clients=6", "partition.alpha=0.5"])
    config.validate_values(cfg)
    data = experiment.partition_dataset(ds, cfg.partition, seed=0)
    n_train, n_test = np.asarray(data.train.n), np.asarray(data.test.n)
    assert (n_train + n_test).tolist() == np.linspace(100, 200, 6, dtype=int).tolist()
    for i in range(6):
        seen = np.concatenate([np.asarray(data.train.x[i, :n_train[i], 0]), np.asarray(data.test.x[i, :n_test[i], 0])])
        assert (seen >= 0).all(), "no official test sample is used"
        assert np.unique(seen).size == seen.size
    info = json.loads(json.dumps(data.summary))["info"]
    assert info["scheme"] == "client_dirichlet" and info["size_range"] == [100, 200]
    assert info["test_from"] == "split_train" and info["max_classes_per_client"] == 3
    assert max(data.summary["train"]["classes_per_client"]) <= 3
