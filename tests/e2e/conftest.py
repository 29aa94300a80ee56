"""Fixtures shared by the end-to-end tests (a test module may define its own of the same name)."""
import pytest

import prune_reference as ref
from prune_support import SEQLEN, Stories

REFERENCE_NSAMPLES = 32  # calibration windows of the numpy parity tests


@pytest.fixture(scope="module")
def stories(tmp_path_factory):
    """stories260K as a Hugging Face directory plus the two halves of TinyStories validation."""
    return Stories(tmp_path_factory.mktemp("stories"))


@pytest.fixture(scope="module")
def reference_model(stories):
    """The float64 numpy LLaMA of prune_reference.py on the same weights."""
    config, weights = ref.load_model(stories.model)
    return ref.Llama(config, weights)


@pytest.fixture(scope="module")
def calib_tokens(stories):
    """The windows `symprune prune --calib first_half --nsamples 32 --seqlen 256 --seed 0` draws."""
    return stories.calib_tokens(REFERENCE_NSAMPLES, SEQLEN)
