// Package testpb is the Ledger service that idemgrpc's tests and examples serve: generated code,
// committed. See ledger.proto for the generator versions.
package testpb

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative ledger.proto
