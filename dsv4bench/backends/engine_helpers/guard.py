"""Guard bytes around every buffer an engine helper kernel writes: the buffer is carved out of
a larger one whose GUARD_BYTES before and after hold a known pattern, checked after the call.
A kernel that writes outside its output (a wrong stride, a missed mask, a padded row written
anyway) raises OutOfBounds from the backend's `finish`: the row is an `error` naming how many
guard bytes changed on which side, instead of a silent pass or a corrupted neighbour."""

from __future__ import annotations

import torch

GUARD_BYTES = 4096
PATTERN = 0xA5


class OutOfBounds(RuntimeError):
    """A kernel wrote outside the buffer it was given."""


class Guarded:
    """A tensor of `shape`/`dtype` (or strides and storage bytes copied from `like`) inside a
    guarded buffer; `check()` after the call."""

    def __init__(self, buffer: torch.Tensor, tensor: torch.Tensor, what: str, nbytes: int):
        self.buffer, self.tensor, self.what, self.nbytes = buffer, tensor, what, nbytes

    @classmethod
    def empty(cls, shape, dtype, device, what: str, fill=None) -> Guarded:
        numel = 1
        for d in shape:
            numel *= d
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        buffer = torch.full((2 * GUARD_BYTES + nbytes,), PATTERN, dtype=torch.uint8, device=device)
        tensor = buffer[GUARD_BYTES : GUARD_BYTES + nbytes].view(dtype).view(shape)
        if fill is not None:
            tensor.fill_(fill)
        return cls(buffer, tensor, what, nbytes)

    @classmethod
    def copy_of(cls, like: torch.Tensor, what: str) -> Guarded:
        """A copy of `like` with its shape, strides and every byte of its storage (padding
        included), guarded."""
        storage = like.untyped_storage()
        nbytes = storage.nbytes()
        flat = torch.empty(0, dtype=torch.uint8, device=like.device)
        flat = flat.set_(storage, 0, (nbytes,), (1,))
        buffer = torch.full(
            (2 * GUARD_BYTES + nbytes,), PATTERN, dtype=torch.uint8, device=like.device
        )
        buffer[GUARD_BYTES : GUARD_BYTES + nbytes] = flat
        inner = buffer[GUARD_BYTES : GUARD_BYTES + nbytes].view(like.dtype)
        offset = inner.storage_offset() + like.storage_offset()  # as_strided's is absolute
        tensor = torch.as_strided(inner, like.shape, like.stride(), offset)
        return cls(buffer, tensor, what, nbytes)

    def inner_bytes(self) -> torch.Tensor:
        return self.buffer[GUARD_BYTES : GUARD_BYTES + self.nbytes]

    def check(self) -> None:
        before = int((self.buffer[:GUARD_BYTES] != PATTERN).sum())
        after = int((self.buffer[GUARD_BYTES + self.nbytes :] != PATTERN).sum())
        if before or after:
            where = ", ".join(
                f"{n} of the {GUARD_BYTES} guard bytes {side}"
                for n, side in ((before, "before"), (after, "after"))
                if n
            )
            raise OutOfBounds(f"the kernel wrote outside {self.what}: {where} it changed")


def check_all(*guarded: Guarded) -> None:
    for g in guarded:
        g.check()
