"""A learning-curve PNG drawn with Pillow: mean reward per step and its moving average."""

from __future__ import annotations

import numpy as np


def moving_average(values: list[float], window: int) -> np.ndarray:
    v = np.asarray(values, dtype=float)
    window = max(1, min(window, len(v)))
    c = np.cumsum(np.insert(v, 0, 0.0))
    out = np.empty_like(v)
    for i in range(len(v)):
        lo = max(0, i + 1 - window)
        out[i] = (c[i + 1] - c[lo]) / (i + 1 - lo)
    return out


def learning_curve_png(path: str, rewards: list[float], title: str) -> None:
    from PIL import Image, ImageDraw

    w, h, left, right, top, bottom = 800, 480, 60, 20, 40, 50
    img = Image.new("RGB", (w, h), "white")
    d = ImageDraw.Draw(img)
    lo, hi = 0.0, 1.0
    n = max(2, len(rewards))

    def xy(i: int, r: float) -> tuple[float, float]:
        x = left + (w - left - right) * i / (n - 1)
        y = top + (h - top - bottom) * (1 - (r - lo) / (hi - lo))
        return x, y

    for k in range(11):  # grid and y labels
        y = xy(0, k / 10)[1]
        d.line([(left, y), (w - right, y)], fill=(230, 230, 230))
        d.text((8, y - 6), f"{k / 10:.1f}", fill="black")
    for i in range(0, n, max(1, n // 10)):
        x = xy(i, 0)[0]
        d.text((x - 6, h - bottom + 8), str(i + 1), fill="black")
    d.rectangle([left, top, w - right, h - bottom], outline="black")
    if rewards:
        d.line([xy(i, r) for i, r in enumerate(rewards)], fill=(150, 170, 230), width=1)
        smooth = moving_average(rewards, 10)
        d.line([xy(i, r) for i, r in enumerate(smooth)], fill=(20, 60, 200), width=3)
    d.text((left, 12), title, fill="black")
    d.text((w // 2 - 20, h - 20), "step", fill="black")
    d.text((w - 300, 12), "mean reward (thin), 10-step average (thick)", fill=(20, 60, 200))
    img.save(path)
