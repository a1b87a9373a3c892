"""Hierarchical risk parity (Lopez de Prado, 2016): skfolio's ``HierarchicalRiskParity`` with
variance risk, single linkage and no optimal leaf reordering, in numpy alone.

The single-linkage dendrogram of the correlation distances ``sqrt((1 - rho) / 2)`` orders the
assets; recursive bisection of that order gives each half of a list its parent's weight in
inverse proportion to its variance (at inverse-variance weights). The dendrogram depends on the
rows' order: the anchors pass them in a canonical one.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from allocator.portfolio.weights import FloatArray

IntArray = NDArray[np.int64]


def correlation_distance(cov: ArrayLike) -> FloatArray:
    s = np.asarray(cov, dtype=np.float64)
    sd = np.sqrt(np.diag(s))
    rho = np.clip(s / np.outer(sd, sd), -1.0, 1.0)
    np.fill_diagonal(rho, 1.0)
    return np.sqrt(0.5 * (1.0 - rho))


def single_linkage_order(distance: ArrayLike) -> IntArray:
    """scipy's ``leaves_list(linkage(squareform(distance), "single"))`` when no distances tie:
    the minimum spanning tree's edges merged by length, the lower id drawn on the left."""
    d = np.asarray(distance, dtype=np.float64)
    n = d.shape[0]
    edges: list[tuple[float, int, int]] = []
    in_tree = np.zeros(n, dtype=bool)
    in_tree[0] = True
    best, parent = d[0].copy(), np.zeros(n, dtype=np.int64)
    for _ in range(n - 1):
        j = int(np.argmin(np.where(in_tree, np.inf, best)))
        edges.append((float(best[j]), int(parent[j]), j))
        in_tree[j] = True
        closer = ~in_tree & (d[j] < best)
        best, parent = np.where(closer, d[j], best), np.where(closer, j, parent)
    edges.sort(key=lambda e: e[0])  # stable, like scipy's mergesort of the tree's edges
    cluster = np.arange(n)  # the cluster id each leaf is now in; merge k gets id n + k
    children: dict[int, tuple[int, int]] = {}
    for k, (_, a, b) in enumerate(edges):
        ra, rb = sorted((int(cluster[a]), int(cluster[b])))
        children[n + k] = (ra, rb)
        cluster[(cluster == ra) | (cluster == rb)] = n + k
    order: list[int] = []
    stack = [2 * n - 2]
    while stack:
        node = stack.pop()
        if node < n:
            order.append(node)
        else:
            left, right = children[node]
            stack += [right, left]
    return np.asarray(order, dtype=np.int64)


def hrp_weights(cov: ArrayLike) -> FloatArray:
    """HRP weights ``(N,)`` of a covariance with positive variances; they sum to 1."""
    s = np.asarray(cov, dtype=np.float64)
    order = single_linkage_order(correlation_distance(s))
    s = s[np.ix_(order, order)]  # in leaf order every cluster is a slice
    inverse_variance = 1.0 / np.diag(s)
    weights = np.ones(s.shape[0])
    clusters = [(0, s.shape[0])]
    while clusters:
        halves = []
        for start, stop in clusters:
            if stop - start < 2:
                continue
            mid = (start + stop) // 2
            left = _cluster_variance(s, inverse_variance, start, mid)
            right = _cluster_variance(s, inverse_variance, mid, stop)
            alpha = 1.0 - left / (left + right)
            weights[start:mid] *= alpha
            weights[mid:stop] *= 1.0 - alpha
            halves += [(start, mid), (mid, stop)]
        clusters = halves
    out = np.empty_like(weights)
    out[order] = weights
    return out


def _cluster_variance(s: FloatArray, inverse_variance: FloatArray, start: int, stop: int) -> float:
    """Variance of the inverse-variance portfolio of the leaves ``start:stop``."""
    w = inverse_variance[start:stop] / inverse_variance[start:stop].sum()
    return float(w @ s[start:stop, start:stop] @ w)
