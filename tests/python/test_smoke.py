import pytest

import strata


def test_error_hierarchy():
    assert issubclass(strata.FormatError, strata.Error)
    with pytest.raises(strata.Error):
        raise strata.FormatError("x")
