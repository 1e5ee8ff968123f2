"""Hone: RL post-training for language models, and control.

The config (`hone.config`) is a leaf: the checks of a recipe that need the registries above it (advantage
estimators, policy losses, engines, placements) are registered here by path, so every program that loads a
recipe runs them, whichever `hone.x` it imports first, and loading one imports nothing it does not read."""

from hone.config.checks import register_recipe_check

register_recipe_check("hone.rl.recipe_checks:check_language_model_recipe", family="language_model")
