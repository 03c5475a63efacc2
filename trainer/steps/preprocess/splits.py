"""Checks after preprocess splits the rows: splits that train and evaluate can use, and
standardised values that float32 holds. Every rejection is an ``InputError`` naming the
setting to change or the column and row, with advice.
"""

from __future__ import annotations

import numpy as np

from trainer.base.errors import InputError
from trainer.steps.preprocess.columns import MAX_AUTO_CLASSES
from trainer.steps.preprocess.config import PreprocessConfig
from trainer.steps.preprocess.tabular import NumericFit, RawInput, param, role_param

MIN_SPLIT_ROWS = 1
"""Rows each split needs: train trains on it, train validates on val, evaluate scores test.
(Train also needs a full batch; only the train step knows the batch size, and checks it.)"""


def _share_for_one_row(largest: int, other: float) -> float | None:
    """The smallest two-decimal share that gives a split one row of a group of ``largest`` rows.

    None if that share leaves too little for training (with ``other``, the other held-out share).
    """
    for hundredths in range(1, 50):
        share = hundredths / 100
        if share + other >= 0.9:
            return None
        if int(np.floor(largest * share + 0.5)) >= MIN_SPLIT_ROWS:
            return share
    return None


def check_splits(
    data: RawInput,
    cfg: PreprocessConfig,
    y: np.ndarray,
    classes: list[str] | None,
    train: np.ndarray,
    val: np.ndarray,
    test: np.ndarray,
) -> None:
    """Reject splits that train or evaluate would fail on, with advice on what to change.

    Raises:
        InputError: ``E_SPLIT``: an empty split, or a class absent from the training split.
    """
    n = len(y)
    fractions = {"val_fraction": cfg.val_fraction, "test_fraction": cfg.test_fraction}
    if train.size < MIN_SPLIT_ROWS:
        raise InputError(
            "E_SPLIT",
            f"the training split is empty: val_fraction {cfg.val_fraction} and test_fraction "
            f"{cfg.test_fraction} of {n} rows leave none; add rows, or lower them with "
            f"{param('preprocess_config_json', {'val_fraction': 0.1, 'test_fraction': 0.1})}",
            data.uri,
        )
    if classes is not None:
        in_train = np.bincount(y[train], minlength=len(classes))
        if (in_train == 0).any():
            k = int(np.argmin(in_train))
            total = int(np.count_nonzero(y == k))
            raise InputError(
                "E_SPLIT",
                f"class {classes[k]!r} of target {cfg.target!r} has {total} row(s), all drawn "
                "into the validation and test splits, so the model could not learn it; add rows "
                f"of that class or remove them, or lower the held-out shares with "
                f"{param('preprocess_config_json', {'val_fraction': 0.05, 'test_fraction': 0.05})}",
                data.uri,
            )
    largest = int(np.bincount(y).max()) if classes is not None else n
    group = (
        f"of each class's rows (the largest class has {largest})"
        if classes is not None
        else f"of {n} rows"
    )
    held_out = {"validation": ("val_fraction", val), "test": ("test_fraction", test)}
    empty = [split for split, (_, rows) in held_out.items() if rows.size < MIN_SPLIT_ROWS]
    if not empty:
        return
    keys = [held_out[split][0] for split in empty]
    what = " and ".join(f"{k} {fractions[k]}" for k in keys)
    if classes is not None and len(classes) > MAX_AUTO_CLASSES:
        # Tiny classes, not small shares, are the cause: no share gives a test split worth
        # scoring, so advice to raise the shares would only lead to a meaningless one.
        raise InputError(
            "E_SPLIT",
            f"target {cfg.target!r} has {len(classes)} classes among {n} rows (the largest "
            f"has {largest}): too few rows per class to hold any out for validation and "
            f"test; a target with this many classes is usually a quantity: set "
            f"{param('task', 'regression')} if it is numeric, or merge rare classes",
            data.uri,
        )
    # Suggest shares that give every empty split a row, if they leave enough for training.
    shares: dict[str, float] = {}
    for key in keys:
        other = sum(shares.get(k, v) for k, v in fractions.items() if k != key)
        share = _share_for_one_row(largest, other)
        if share is None:
            shares = {}
            break
        shares[key] = share
    # Here, not at the top: the evaluate package imports torch, which preprocess (a step that
    # reads tables in a small memory budget) has no use for.
    from trainer.steps.evaluate import MIN_GATE_ROWS

    counts = np.bincount(y) if classes is not None else np.array([n])
    test_share = shares.get("test_fraction")
    if test_share and int(np.floor(counts * test_share + 0.5).sum()) < MIN_GATE_ROWS:
        shares = {}  # raised only to a test split too small to gate on: no fix
    fix = f", or raise {' and '.join(keys)} with {param('preprocess_config_json', shares)}"
    raise InputError(
        "E_SPLIT",
        f"the {' and '.join(empty)} split{'s are' if len(empty) > 1 else ' is'} empty: "
        f"{what} {group} round{'' if len(keys) > 1 else 's'} to 0 rows; "
        f"add rows{fix if shares else ''}",
        data.uri,
    )


def check_scaled(
    data: RawInput, fit: NumericFit, scaled: np.ndarray, raw: np.ndarray, perm: np.ndarray
) -> None:
    """Reject a standardised column that overflows float32 (inf where the input was finite).

    Raises:
        InputError: ``E_OVERFLOW`` naming the column, the value and its row in the user's data.
    """
    bad = ~np.isfinite(scaled)
    if not bad.any():
        return
    row = int(perm[int(np.argmax(bad))])
    raise InputError(
        "E_OVERFLOW",
        f"column {fit.name!r}: {raw[row]:g} standardised with the training split's mean "
        f"{fit.mean:g} and std {fit.std:g} overflows float32; fix the value or rescale the "
        f"column (e.g. a log), or drop it with {role_param(fit.name, 'drop')}",
        data.locate(row),
    )
