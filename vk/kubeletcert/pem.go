package kubeletcert

import (
	"encoding/pem"
	"errors"
)

// pemBlock returns the DER bytes of a PEM "CERTIFICATE REQUEST" block.
func pemBlock(b []byte) ([]byte, error) {
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return nil, errors.New("the request is not a PEM CERTIFICATE REQUEST block")
	}
	return block.Bytes, nil
}
