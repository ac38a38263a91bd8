//go:build !linux

package main

import "syscall"

func hogAttr() *syscall.SysProcAttr { return nil }
