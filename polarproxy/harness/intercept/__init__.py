"""`record --intercept`: a harness run through the MITM proxy with its real provider."""
