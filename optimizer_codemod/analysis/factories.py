"""torch's tensor factories, by what the values they make depend on."""

# Factories that take `device=`, by what moving the device into the call keeps:
# - "exact": the values do not depend on the dtype they are made in (0, 1, uninitialised, an
#   identity matrix), so a dtype given to `.to()` can move into the call too;
# - "value": the same values only in the same dtype (`full(n, 0.1)` made in float16 rounds
#   once, made in float32 and converted rounds twice), so only the device moves;
# - "random": the device's generator draws other numbers than the CPU's;
# - "data": `torch.tensor(data)`: builds the tensor on the host and copies it either way, even
#   with `device=` (OPT203 leaves it alone; OPT202 counts its blocking copy).
FACTORIES = {
    **{f"torch.{name}": "exact" for name in ("zeros", "ones", "empty", "eye")},
    **{f"torch.{name}_like": "exact" for name in ("zeros", "ones", "empty")},
    **{f"torch.{name}": "value" for name in ("full", "full_like", "arange")},
    **{
        f"torch.{name}": "random"
        for name in ("rand rand_like randn randn_like randint randint_like randperm normal".split())
    },
    "torch.tensor": "data",
}
