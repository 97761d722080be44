"""wsi.core.config: dotted changes to a typed config (what `wsi train --set` and the recipes use)."""

from __future__ import annotations

import pytest

from wsi.core.errors import ConfigError
from wsi.pipelines.study.tasks import load_task


def test_task_replace_checks_each_value_against_its_own_field() -> None:
    """Dotted overrides (the CLI's and the recipes') are typed per field; the untouched groups are the
    same objects, not re-parsed copies."""
    task = load_task("nsclc-subtype")
    changed = task.replace(**{"model.attention": "sima", "epochs": "5", "optimizer.lr": 1e-3})
    assert (changed.model.attention, changed.epochs, changed.optimizer.lr) == ("sima", 5, 1e-3)
    assert changed.split is task.split and changed.model.preset == task.model.preset
    with pytest.raises(ConfigError, match=r"epochs: .*valid integer.*'x'"):
        task.replace(epochs="x")
    with pytest.raises(ConfigError, match=r"no field 'nope' \(valid fields: preset, attention"):
        task.replace(**{"model.nope": 1})
    with pytest.raises(ConfigError, match="not inside a group"):
        task.replace(**{"epochs.x": 1})
    with pytest.raises(ConfigError, match=r"epochs: Input should be greater than or equal to 1 \(got 0\)"):
        task.replace(epochs=0)


def test_task_replace_sets_keys_of_a_free_form_mapping() -> None:
    task = load_task("nsclc-subtype")
    changed = task.replace(**{"input_options.bag_size": 64})
    assert changed.input_options == {**task.input_options, "bag_size": 64}
