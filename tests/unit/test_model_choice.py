"""Which checkpoint a run registers: the best by eval accuracy among evaluated checkpoints, else the last."""

from __future__ import annotations

import math

from asyncrl.run.checkpoint_models import model_folder_files, registered_model_name
from asyncrl.run.model_choice import Choice, choose_checkpoint


def test_no_checkpoint_registers_nothing():
    assert choose_checkpoint([], {3: {"eval/accuracy": 0.5}}) is None


def test_without_eval_points_the_last_checkpoint():
    assert choose_checkpoint([2, 4, 6], {}) == Choice(6, "last", None)
    # points only at versions that are not checkpoints: still the last
    assert choose_checkpoint([2, 4], {1: {"eval/accuracy": 0.9}, 3: {"eval/accuracy": 0.8}}) == Choice(4, "last")


def test_best_by_eval_among_evaluated_checkpoints():
    figures = {0: {"eval/accuracy": 0.99}, 2: {"eval/accuracy": 0.625}, 4: {"eval/accuracy": 0.75},
               6: {"eval/accuracy": 0.6875}, 5: {"eval/accuracy": 1.0}}
    choice = choose_checkpoint([2, 4, 6], figures)
    assert choice == Choice(4, "best_eval", 0.75)
    assert choice.as_dict() == {"checkpoint_version": 4, "reason": "best_eval", "eval_accuracy": 0.75}


def test_a_tie_goes_to_the_later_version_and_unknown_or_nan_accuracies_never_win():
    figures = {2: {"eval/accuracy": 0.5}, 4: {"eval/accuracy": 0.5}, 6: {"eval/accuracy": math.nan},
               8: {"eval/correct": 30.0}}
    assert choose_checkpoint([2, 4, 6, 8, 10], figures) == Choice(4, "best_eval", 0.5)


def test_registered_name_defaults_to_experiment_and_config_name():
    assert registered_model_name("", "asyncrl", "smoke") == "asyncrl-smoke"
    assert registered_model_name("team/arith", "asyncrl", "smoke") == "team/arith"


def test_a_checkpoints_model_folder_is_its_weights_config_and_tokenizer():
    names = ["COMMITTED", "config.json", "critic_0.safetensors", "generation_config.json", "meta.json",
             "model.safetensors", "optimizer.safetensors", "tokenizer.json", "tokenizer_config.json"]
    assert model_folder_files([n for n in names if n != "COMMITTED"]) == [
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
