"""Reward functions the tests name by import path (task.reward)."""


def length_bonus(prompt: str, response: str, answer: str) -> float:
    return float(len(response) > 0)
