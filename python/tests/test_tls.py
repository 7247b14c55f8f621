"""TLS on the tcp links through the binding: the communicator options tls_cert, tls_key
and tls_ca_file (tutti_comm_opts_t's fields), with certificates made here by the openssl
command; an allreduce against NumPy's sum, and a certificate without its key refused on
every rank naming the knob. tests/test_tls.c covers the transport itself."""
import shutil
import subprocess

import numpy as np
import pytest

from ranks import launch, run


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    if not shutil.which("openssl"):
        pytest.skip("no openssl command to make certificates with (Debian: openssl)")
    d = tmp_path_factory.mktemp("tls")
    ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
    script = (f"openssl req -x509 {ec} -keyout ca.key -out ca.pem -days 2 -subj /CN=ca && "
              f"openssl req {ec} -keyout node.key -out node.csr -subj /CN=node && "
              "openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
              "-out node.pem -days 2")
    subprocess.run(script, shell=True, cwd=d, check=True, capture_output=True, timeout=60)
    return d


def _sum(comm):
    a = np.arange(200000, dtype=np.float64) * (comm.rank + 1)
    comm.allreduce(a)
    return a


def test_allreduce_over_tls(certs):
    opts = dict(transport="tcp", tls_cert=str(certs / "node.pem"),
                tls_key=str(certs / "node.key"), tls_ca_file=str(certs / "ca.pem"))
    got = launch(_sum, 3, **opts)
    errors = [v for k, v in got.values() if k == "error"]
    if errors and all("without OpenSSL" in e[1] for e in errors):
        pytest.skip("tutti was built without OpenSSL")
    got = run(_sum, 3, **opts)
    want = np.arange(200000, dtype=np.float64) * 6
    for r in range(3):
        assert np.array_equal(got[r], want), r


def test_certificate_without_key_is_refused(certs):
    got = launch(_sum, 2, transport="tcp", tls_cert=str(certs / "node.pem"),
                 tls_ca_file=str(certs / "ca.pem"))
    assert sorted(got) == [0, 1], got
    for r, (kind, value) in got.items():
        assert kind == "error", (r, value)
        assert value[0] == "ConfigError" and "TUTTI_TLS_KEY" in value[1], (r, value)
