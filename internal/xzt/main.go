//go:build gpupinexp

package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/klauspost/compress/zstd"
)

func main() {
	for _, c := range []int{1, 2, 4} {
		f, _ := os.Open(os.Args[1])
		t := time.Now()
		zr, _ := zstd.NewReader(bufio.NewReader(f), zstd.WithDecoderConcurrency(c), zstd.WithDecoderLowmem(true))
		n, err := io.Copy(io.Discard, zr)
		fmt.Println(c, n, err, time.Since(t))
		zr.Close()
		f.Close()
	}
}
