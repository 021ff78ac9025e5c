"""Lorenz-96 model (Lorenz 1996), vectorized over any leading dimensions.

``dx_i/dt = (x_{i+1} − x_{i−2}) x_{i−1} − x_i + F`` on a periodic ring; with
40 variables and F = 8 it is the standard chaotic test bed of ensemble data
assimilation (e.g. Sakov & Oke 2008, DAPPER). Integrated with classical RK4.
"""

from __future__ import annotations

import numpy as np

__all__ = ["FORCING", "DT", "tendency", "rk4_step", "integrate", "Lorenz96"]

FORCING = 8.0
DT = 0.05


def tendency(x: np.ndarray, forcing: float = FORCING) -> np.ndarray:
    """Time derivative for states ``x`` of shape (..., n) (the last axis is the ring)."""
    return (np.roll(x, -1, axis=-1) - np.roll(x, 2, axis=-1)) * np.roll(x, 1, axis=-1) - x + forcing


def rk4_step(x: np.ndarray, dt: float = DT, forcing: float = FORCING) -> np.ndarray:
    """One fourth-order Runge–Kutta step of length ``dt``; ``x`` is (..., n)."""
    k1 = tendency(x, forcing)
    k2 = tendency(x + 0.5 * dt * k1, forcing)
    k3 = tendency(x + 0.5 * dt * k2, forcing)
    k4 = tendency(x + dt * k3, forcing)
    return x + (dt / 6.0) * (k1 + 2.0 * k2 + 2.0 * k3 + k4)


def integrate(x: np.ndarray, n_steps: int, dt: float = DT, forcing: float = FORCING) -> np.ndarray:
    """``n_steps`` RK4 steps from ``x`` (..., n); returns the final state."""
    x = np.array(x, dtype=float)
    for _ in range(n_steps):
        x = rk4_step(x, dt, forcing)
    return x


class Lorenz96:
    """A Lorenz-96 model instance: ``model(x, n_steps)`` advances states (..., n).

    Parameters
    ----------
    n : int
        Number of variables (≥ 4).
    forcing : float
    dt : float
    """

    def __init__(self, n: int = 40, forcing: float = FORCING, dt: float = DT) -> None:
        if n < 4:
            raise ValueError("Lorenz-96 needs at least 4 variables")
        self.n, self.forcing, self.dt = n, forcing, dt

    def __call__(self, x: np.ndarray, n_steps: int = 1) -> np.ndarray:
        if np.shape(x)[-1] != self.n:
            raise ValueError(f"state has {np.shape(x)[-1]} variables, model {self.n}")
        return integrate(x, n_steps, self.dt, self.forcing)
