module tenure/benchmarks/pacer

go 1.19
