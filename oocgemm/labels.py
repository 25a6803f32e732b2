"""xarray's labels carried to the product: ``multiply(X.T, X)`` of a (samples, features)
DataArray, into memory, is a (features, features) DataArray whose rows have op(a)'s dimension
and coordinates and whose columns op(b)'s (a name both sides share gets ``_2`` on the
columns: xarray does not support a dimension twice)."""

from __future__ import annotations

from typing import Any

from .storage.base import library_of


def labelled(c, a, b, trans_a: bool, trans_b: bool) -> Any:
    """``c`` (the product, a numpy array) as a DataArray labelled from ``a`` and ``b`` where
    either is one; ``c`` itself otherwise."""
    if library_of(a) != "xarray" and library_of(b) != "xarray":
        return c
    import xarray

    (row_dim, row_coords), (col_dim, col_coords) = (
        _side(a, 1 if trans_a else 0, "row"), _side(b, 0 if trans_b else 1, "col"))
    if col_dim == row_dim:  # X^T X: (features, features_2)
        col_dim = f"{col_dim}_2"
    coords = {**row_coords}
    for name, variable in col_coords.items():
        taken = name == row_dim or name in row_coords
        coords[f"{name}_2" if taken else name] = xarray.Variable(
            (col_dim,), variable.values, variable.attrs)
    return xarray.DataArray(c, dims=(row_dim, col_dim), coords=coords)


def _side(x, axis: int, default: str) -> tuple[str, dict]:
    """The dimension of ``x``'s ``axis`` and the coordinates along it alone (a DataArray's);
    a default name and none for another array."""
    if library_of(x) != "xarray" or not hasattr(x, "dims"):
        return f"dim_{default}", {}
    dim = x.dims[axis]
    coords = {name: coord.variable for name, coord in x.coords.items()
              if coord.dims == (dim,)}
    return str(dim), coords
