"""Which variable (and pressure level) of an ERA5 source each channel of dlscale's layout comes from.

A channel is named as in the tutorial's files: a surface field (``u10``, ``t2m``, ``tcwv``, ...) or a
pressure-level field as letter + level in hPa (``z500``, ``t850``, ``r500``). ERA5 comes with two naming
schemes for the same fields: the long names of ARCO-ERA5 and WeatherBench2 zarr stores (``10m_u_component_of_wind``,
``geopotential`` with a ``level`` dimension) and the short names of the Copernicus Climate Data Store's netCDF
files (``u10``, ``z`` with ``level`` or, in the new CDS, ``pressure_level``). Both are looked for, long name
first. A channel name that is itself a variable of the source (e.g. ``total_precipitation_6hr``) is taken as
it is, so a user can add fields this table does not know.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dlscale.data.era5.layout import ERA5_CHANNELS
from dlscale.errors import ConfigError, DataError

# channel -> the source variable names that hold it, long (ARCO-ERA5 / WeatherBench2) name first
SURFACE_VARIABLES: dict[str, tuple[str, ...]] = {
    "u10": ("10m_u_component_of_wind", "u10"),
    "v10": ("10m_v_component_of_wind", "v10"),
    "u100": ("100m_u_component_of_wind", "u100"),
    "v100": ("100m_v_component_of_wind", "v100"),
    "t2m": ("2m_temperature", "t2m"),
    "d2m": ("2m_dewpoint_temperature", "d2m"),
    "sp": ("surface_pressure", "sp"),
    "msl": ("mean_sea_level_pressure", "msl"),
    "tcwv": ("total_column_water_vapour", "tcwv"),
    "sst": ("sea_surface_temperature", "sst"),
    "tp": ("total_precipitation", "tp"),
}

# letter of a pressure-level channel (z500 -> z) -> the source variable names that hold the field
PRESSURE_LEVEL_VARIABLES: dict[str, tuple[str, ...]] = {
    "z": ("geopotential", "z"),
    "t": ("temperature", "t"),
    "u": ("u_component_of_wind", "u"),
    "v": ("v_component_of_wind", "v"),
    "r": ("relative_humidity", "r"),
    "q": ("specific_humidity", "q"),
    "w": ("vertical_velocity", "w"),
}

MOST_HPA = 1100.0  # above every pressure of the atmosphere in hPa: levels all above it are in Pa


def levels_in_hpa(levels: Sequence[float], units: str) -> tuple[list[float], str | None]:
    """A level coordinate's values in hPa, and why they were divided by 100 when the coordinate is in Pa (its
    ``units`` attribute says ``Pa``, or every level is above :data:`MOST_HPA`); None when they are hPa already.
    Forecasts and ERA5 stores alike come with either (CDS's are hPa, some models write Pa)."""
    values = [float(level) for level in levels]
    said_pa = units.strip().lower() == "pa"
    if not said_pa and not (values and all(level > MOST_HPA for level in values)):
        return values, None
    why = f"its units are {units.strip()!r}" if said_pa else f"every level is above {MOST_HPA:g}"
    return [level / 100.0 for level in values], why


_PRESSURE_LEVEL_CHANNEL = re.compile(r"^([a-z])(\d+)$")


@dataclass(frozen=True)
class ChannelRequest:
    """One channel of the output: its name, the source variable names that may hold it, and its level."""

    name: str
    candidates: tuple[str, ...]
    level_hpa: int | None  # None: a surface (single-level) field


@dataclass(frozen=True)
class ChannelSource:
    """Where one output channel comes from in a particular source."""

    name: str
    variable: str
    level_hpa: int | None


def weatherbench2_name(channel: str) -> tuple[str, int | None] | None:
    """The variable and pressure level (hPa) under which WeatherBench2's and ARCO-ERA5's stores keep ``channel``:
    ``z500`` -> ``("geopotential", 500)``, ``t2m`` -> ``("2m_temperature", None)``; None for a channel this table
    does not know (it keeps its own name in a forecast file)."""
    if channel in SURFACE_VARIABLES:
        return SURFACE_VARIABLES[channel][0], None
    match = _PRESSURE_LEVEL_CHANNEL.match(channel)
    if match and match.group(1) in PRESSURE_LEVEL_VARIABLES:
        return PRESSURE_LEVEL_VARIABLES[match.group(1)][0], int(match.group(2))
    return None


def channel_of_field(variable: str, level: int | None) -> str | None:
    """The reverse of :func:`weatherbench2_name`: the channel a forecast file's variable (at a pressure level in
    hPa, or None) holds, in either naming scheme: ``("geopotential", 500)`` and ``("z", 500)`` -> ``z500``,
    ``"2m_temperature"`` and ``"t2m"`` -> ``t2m``; a surface variable this table does not know keeps its own name
    (as :func:`channel_request` takes it); None for a pressure-level variable it does not know."""
    if level is None:
        return next((channel for channel, names in SURFACE_VARIABLES.items() if variable in names), variable)
    letter = next((key for key, names in PRESSURE_LEVEL_VARIABLES.items() if variable in names), None)
    return None if letter is None else f"{letter}{int(level)}"


def parse_channels(text: str | None) -> tuple[str, ...]:
    """The channel list of ``--channels`` (comma-separated), or the tutorial's 20 channels when None."""
    if text is None:
        return ERA5_CHANNELS
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    if not names:
        raise ConfigError("import-era5: --channels is empty; name channels like u10,t2m,z500")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ConfigError(f"import-era5: --channels names {', '.join(repeated)} more than once")
    return names


def channel_request(name: str) -> ChannelRequest:
    """What channel ``name`` means: a known surface field, letter + level, or a source variable's own name."""
    if name in SURFACE_VARIABLES:
        return ChannelRequest(name, SURFACE_VARIABLES[name], None)
    match = _PRESSURE_LEVEL_CHANNEL.match(name)
    if match and match.group(1) in PRESSURE_LEVEL_VARIABLES:
        return ChannelRequest(name, PRESSURE_LEVEL_VARIABLES[match.group(1)], int(match.group(2)))
    return ChannelRequest(name, (name,), None)


def resolve_channels(
    names: Sequence[str], variables: Mapping[str, Sequence[int] | None], source: str
) -> list[ChannelSource]:
    """Bind each channel to a variable of the source; ``variables`` maps each variable of the source to its
    pressure levels in hPa (None for a field without a level dimension).

    A channel the source cannot give is one DataError naming the channel, the names looked for and what the
    source has, so a user sees at once whether a variable or only a level is missing.
    """
    bound: list[ChannelSource] = []
    for name in names:
        request = channel_request(name)
        found = next((candidate for candidate in request.candidates if candidate in variables), None)
        if found is None:
            looked_for = " or ".join(repr(candidate) for candidate in request.candidates)
            raise DataError(
                f"{source}: no variable for channel {name} (looked for {looked_for}); the source has "
                f"{', '.join(sorted(variables)) or 'no data variables'}. Choose other channels with --channels"
            )
        levels = variables[found]
        if request.level_hpa is None and levels is not None:
            raise DataError(
                f"{source}: channel {name} needs a single-level field, but variable {found!r} has pressure "
                f"levels {_levels_text(levels)}; name a level, e.g. {name}{levels[0]}"
            )
        if request.level_hpa is not None:
            if levels is None:
                raise DataError(
                    f"{source}: channel {name} needs level {request.level_hpa} hPa, but variable {found!r} "
                    "has no pressure-level dimension"
                )
            if request.level_hpa not in levels:
                raise DataError(
                    f"{source}: channel {name} needs level {request.level_hpa} hPa of variable {found!r}, "
                    f"which has levels {_levels_text(levels)}"
                )
        bound.append(ChannelSource(name, found, request.level_hpa))
    return bound


def _levels_text(levels: Sequence[int]) -> str:
    return ", ".join(str(level) for level in levels) + " hPa"
